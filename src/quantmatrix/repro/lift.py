"""Lift quantmatrix functions out of the package into one standalone script: the functions a repro script runs
(adapter/, measure/, checks/) copied by source with everything they reference, so the script observes exactly
what the check observed, with no quantmatrix installed and no vLLM name spelled a second time.

A reference to another quantmatrix module (`config.reason`, `P.VLLM_VERSION`, a function-local
`from quantmatrix.adapter import nvfp4`) is rewritten to the lifted object's own name; an external import (torch,
safetensors, the standard library) is copied as the module wrote it. Table functions that read package data or
import modules by name (the producers' tensor names) are `frozen`: their answers are computed here and written
into the script as a table. Anything the lifter cannot carry (two objects with one name, package data, a leftover
quantmatrix import) is a ReproError naming it, never a script that fails later.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import inspect
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

from quantmatrix.errors import ReproError
from quantmatrix.repro import syntax

_PACKAGE = "quantmatrix"
_FORBIDDEN = {"__file__", "__package__", "__spec__", "__path__"}


@dataclasses.dataclass
class _Item:
    key: tuple[str, str]  # (defining module, name there)
    name: str  # the name in the script
    source: str
    deftime: set[str]  # script names evaluated when the item is defined (decorators, defaults, class bodies, values)


@dataclasses.dataclass
class _Module:
    """One quantmatrix module's source, its top-level definitions and the statements that bind its imports."""

    module: ModuleType
    text: str
    lines: list[str]
    defs: dict[str, ast.stmt]
    imports: dict[str, ast.stmt]


def to_source(value: Any) -> str:
    """Python source for a plain data value (dicts, lists, tuples, sets, frozensets, str, numbers, None)."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{to_source(k)}: {to_source(v)}" for k, v in value.items()) + "}"
    if isinstance(value, frozenset):
        return f"frozenset({{{', '.join(sorted(map(to_source, value)))}}})" if value else "frozenset()"
    if isinstance(value, (set, list, tuple)):
        items = sorted(map(to_source, value)) if isinstance(value, set) else [to_source(v) for v in value]
        if isinstance(value, tuple):
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        return ("[" + ", ".join(items) + "]") if isinstance(value, list) else ("{" + ", ".join(items) + "}")
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    if value is None or isinstance(value, (str, int, float, bool)):
        return repr(value)
    raise ReproError(f"cannot write {type(value).__name__} {value!r:.80} into a script as data")


class Lifter:
    """Collects objects and what they need; `script()` writes them out in an order Python can define them in."""

    def __init__(self, frozen: Mapping[Callable[..., Any], Iterable[tuple[Any, ...]]] | None = None) -> None:
        # a frozen function -> the argument tuples it is called with; its answers become a table in the script
        self.frozen = {(f.__module__, f.__name__): (f, tuple(calls)) for f, calls in (frozen or {}).items()}
        self.items: dict[tuple[str, str], _Item] = {}
        self.names: dict[str, tuple[str, str]] = {}
        self.imports: dict[str, str] = {}  # the import statements the lifted code needs (each once)
        self._modules: dict[str, _Module] = {}

    # ------------------------------------------------------------------------------------------- adding
    def add(self, obj: Any) -> str:
        """Lift a top-level function or class (and everything it needs); its name in the script."""
        module, name = getattr(obj, "__module__", ""), getattr(obj, "__qualname__", "")
        if not module.startswith(_PACKAGE) or "." in name or "<" in name:
            raise ReproError(f"only top-level quantmatrix functions and classes lift, not {obj!r:.80}")
        return self._item(module, name)

    def _mod(self, name: str) -> _Module:
        if name not in self._modules:
            module = importlib.import_module(name)
            text = inspect.getsource(module)
            tree = ast.parse(text)
            defs: dict[str, ast.stmt] = {}
            imports: dict[str, ast.stmt] = {}
            for stmt in tree.body:
                for bound in syntax.bound_by(stmt):
                    (imports if syntax.is_import(stmt) else defs)[bound] = stmt
            self._modules[name] = _Module(module, text, text.splitlines(), defs, imports)
        return self._modules[name]

    def _claim(self, name: str, key: tuple[str, str]) -> None:
        owner = self.names.get(name)
        if owner is not None and owner != key:
            raise ReproError(f"{key[0]}.{key[1]} and {owner[0]}.{owner[1]} both lift to the name {name!r}: "
                             "rename one of them")
        self.names[name] = key

    def _item(self, module: str, name: str) -> str:
        key = (module, name)
        if key in self.items:
            return self.items[key].name
        self._claim(name, key)
        if key in self.frozen:
            self.items[key] = _Item(key, name, self._frozen_source(key), set())
            return name
        mod = self._mod(module)
        stmt = mod.defs.get(name)
        if stmt is None:
            raise ReproError(f"{module}.{name} is not defined at the top of its module, so it cannot be lifted")
        item = _Item(key, name, "", set())
        self.items[key] = item  # before resolving: a recursive reference finds it
        item.source, item.deftime = self._rewrite(mod, stmt, name)
        return name

    def _frozen_source(self, key: tuple[str, str]) -> str:
        fn, calls = self.frozen[key]
        table = {args: _plain(fn(*args)) for args in calls}
        return (f"def {key[1]}(*args):  # frozen: {key[0]}.{key[1]} answered when the script was made\n"
                f"    return {to_source(table)}[args]\n")

    # --------------------------------------------------------------------------------------- resolving
    def _ref(self, mod: _Module, name: str) -> str | ModuleType | None:
        """What a global `name` of `mod` is in the script: a lifted name, a quantmatrix module (its attributes are
        lifted one by one), or None for a builtin or an external import (copied into the script's imports)."""
        if name in _FORBIDDEN:
            raise ReproError(f"{mod.module.__name__} uses {name}: package data cannot travel in a script")
        if name in mod.defs:
            return self._item(mod.module.__name__, name)
        stmt = mod.imports.get(name)
        if stmt is None:
            if hasattr(builtins, name):
                return None
            raise ReproError(f"{mod.module.__name__}: global {name!r} is neither defined, imported nor a builtin")
        if not _from_package(stmt):
            self._external(mod, stmt, name)
            return None
        value = mod.module.__dict__.get(name)
        if isinstance(value, ModuleType):
            return value
        return self._origin(mod, stmt, name, value)

    def _external(self, mod: _Module, stmt: ast.stmt, name: str) -> None:
        """Copy the statement that imports `name` (torch, safetensors, the standard library) into the script,
        unless another module already bound the name to something else."""
        binding = syntax.binding(stmt, name, mod.text)
        owner = self.names.get(name)
        if owner is not None and owner != ("import", binding):
            raise ReproError(f"{name!r} means {binding} in {mod.module.__name__} but {owner[1]} elsewhere")
        self.names[name] = ("import", binding)
        text = ast.get_source_segment(mod.text, stmt) or ""
        self.imports[text] = text

    def _origin(self, mod: _Module, stmt: ast.stmt, name: str, value: Any) -> str:
        """A name imported from another quantmatrix module: lift it where it is defined; an alias gets a line."""
        if inspect.isfunction(value) or inspect.isclass(value):
            lifted = self._item(value.__module__, value.__qualname__)
        else:
            assert isinstance(stmt, ast.ImportFrom)
            alias = next(a for a in stmt.names if (a.asname or a.name) == name)
            ref = self._ref(self._mod(syntax.absolute(stmt, mod.module.__name__)), alias.name)
            if not isinstance(ref, str):
                raise ReproError(f"{mod.module.__name__} imports {name} from quantmatrix, but it is not data or "
                                 "a function the lifter can carry")
            lifted = ref
        if lifted != name:
            key = (mod.module.__name__, name)
            if key not in self.items:
                self._claim(name, key)
                self.items[key] = _Item(key, name, f"{name} = {lifted}\n", {lifted})
        return name

    def _rewrite(self, mod: _Module, stmt: ast.stmt, name: str) -> tuple[str, set[str]]:
        """The statement's source with quantmatrix module references replaced, and its definition-time needs."""
        text = _segment(mod, stmt, name)
        tree = ast.parse(text)
        edits: list[tuple[int, int, int, int, str]] = []
        local = self._local_imports(mod, tree, edits)
        bare = syntax.NoAnnotations().visit(ast.parse(text))
        runtime, deftime = syntax.global_names(ast.unparse(bare), name)
        shadowed = syntax.local_names(ast.unparse(bare))
        resolved: dict[str, str | ModuleType | None] = dict(local)
        for ref in sorted((runtime | deftime) - set(local)):
            resolved[ref] = self._ref(mod, ref)
        for ref, lifted in local.items():
            if isinstance(lifted, str) and lifted != ref:
                raise ReproError(f"{mod.module.__name__}.{name} imports {lifted} as {ref} inside a function")
        needed: set[str] = set()
        annotations = syntax.annotation_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in annotations:
                continue
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and isinstance(resolved.get(node.value.id), ModuleType):
                lifted = self._attr(resolved[node.value.id], node.attr)  # type: ignore[arg-type]
                if lifted in shadowed:  # `build = layers.build(...)`: a local of that name hides the lift
                    lifted = self._alias(f"{node.value.id}_{lifted}", lifted)
                edits.append((node.lineno, node.col_offset, node.end_lineno or node.lineno,
                              node.end_col_offset or 0, lifted))
                if node.value.id in deftime:
                    needed.add(lifted)
            elif isinstance(node, ast.Name) and isinstance(resolved.get(node.id), ModuleType) \
                    and not syntax.is_attribute_base(tree, node):
                raise ReproError(f"{mod.module.__name__}.{name} uses the module {node.id} as a value")
        needed |= {str(resolved[n]) for n in deftime if isinstance(resolved.get(n), str)}
        return syntax.apply_edits(text, edits), needed

    def _alias(self, alias: str, lifted: str) -> str:
        key = ("alias", alias)
        if key not in self.items:
            self._claim(alias, key)
            self.items[key] = _Item(key, alias, f"{alias} = {lifted}\n", {lifted})
        return alias

    def _attr(self, module: ModuleType, attr: str) -> str:
        mod = self._mod(module.__name__)
        if attr in mod.defs:
            return self._item(module.__name__, attr)
        ref = self._ref(mod, attr)
        if not isinstance(ref, str):
            raise ReproError(f"{module.__name__}.{attr} is not a quantmatrix definition that can be lifted")
        return ref

    def _local_imports(self, mod: _Module, tree: ast.AST, edits: list) -> dict[str, ModuleType | str]:
        """Function-local `from quantmatrix... import x`: the statement becomes `pass`, `x` refers to the lift."""
        out: dict[str, ModuleType | str] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node.col_offset > 0 and _from_package(node):
                for alias in node.names:
                    local = alias.asname or alias.name
                    base = syntax.absolute(node, mod.module.__name__) if isinstance(node, ast.ImportFrom) else ""
                    full = f"{base}.{alias.name}" if base else alias.name
                    if full in sys.modules or _is_module(full):
                        out[local] = importlib.import_module(full)
                    else:
                        out[local] = self._item(*_defining(base, alias.name))
                edits.append((node.lineno, node.col_offset, node.end_lineno or node.lineno,
                              node.end_col_offset or 0, "pass"))
        return out

    # ---------------------------------------------------------------------------------------- writing
    def script(self) -> tuple[list[str], list[str]]:
        """(import statements, definitions in an order where everything a definition evaluates comes first)."""
        order: list[_Item] = []
        done: set[str] = set()
        by_name = {item.name: item for item in self.items.values()}

        def visit(item: _Item, path: tuple[str, ...]) -> None:
            if item.name in done:
                return
            if item.name in path:
                raise ReproError(f"definitions need each other to exist first: {' -> '.join(path)}")
            for dep in sorted(item.deftime):
                if dep in by_name and dep != item.name:
                    visit(by_name[dep], (*path, item.name))
            done.add(item.name)
            order.append(item)

        for item in list(self.items.values()):
            visit(item, ())
        return sorted(set(self.imports.values()), key=syntax.import_order), [i.source for i in order]


# ------------------------------------------------------------------------------------------------ helpers


def _plain(value: Any) -> Any:
    """A frozen answer as plain data (mappings become dicts, recursively)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _from_package(stmt: ast.stmt) -> bool:
    nodes = [n for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return any(n.level > 0 or (n.module or "").split(".")[0] == _PACKAGE if isinstance(n, ast.ImportFrom)
               else any(a.name.split(".")[0] == _PACKAGE for a in n.names) for n in nodes)


def _is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def _defining(module: str, name: str) -> tuple[str, str]:
    """Where an object imported as `module.name` is defined (a function or class names its own module)."""
    value = getattr(importlib.import_module(module), name)
    if inspect.isfunction(value) or inspect.isclass(value):
        return value.__module__, value.__qualname__
    return module, name


def _segment(mod: _Module, stmt: ast.stmt, name: str) -> str:
    """The statement's lines (decorators included); for `A, B = 1, 2` only `B = 2`."""
    if isinstance(stmt, ast.Assign) and not (len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        target = stmt.targets[0]
        if isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple) \
                and len(target.elts) == len(stmt.value.elts):
            for t, v in zip(target.elts, stmt.value.elts, strict=True):
                if isinstance(t, ast.Name) and t.id == name:
                    return f"{name} = {ast.get_source_segment(mod.text, v)}\n"
        raise ReproError(f"{mod.module.__name__}.{name} is bound by an assignment the lifter cannot split")
    first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", []))])
    return "\n".join(mod.lines[first - 1: stmt.end_lineno]) + "\n"


