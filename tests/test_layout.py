"""The package tree is the architecture: imports run one way down the data path, with no cycles, and no module
or function outgrows what a reader can hold. Read from the source (AST), so a lazy import inside a function
counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 80
# Lower ranks never import higher ones; packages of equal rank never import each other (bounded raises errors).
RANK = {"errors": 0, "atomic": 0, "properties": 0, "bounded": 0.5, "schema": 1, "host": 2, "adapter": 3,
        "checkpoints": 4, "engine": 5,
        "measure": 6, "checks": 7, "guard": 8, "pytest_plugin": 8, "report": 8, "bisect": 9,
        "repro": 9, "ci": 9, "cli": 10}


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "quantmatrix").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The quantmatrix modules `name` imports (a package's own __init__ excluded, as re-exports are)."""
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + "."):
                found.add(t)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _part(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_imports_run_down_the_data_path():
    """schema -> host -> adapter -> checkpoints -> engine -> measure -> checks -> plugin / report -> bisect -> cli,
    never up."""
    wrong = []
    for module, targets in GRAPH.items():
        here = _part(module)
        for t in targets:
            there = _part(t)
            if there and there != here and RANK[there] >= RANK.get(here, 0):
                wrong.append(f"{module} imports {t}")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    seen: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        seen[m] = 1
        stack.append(m)
        for t in sorted(GRAPH[m]):
            if seen.get(t) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in seen:
                visit(t)
        stack.pop()
        seen[m] = 2

    for m in sorted(GRAPH):
        if m not in seen:
            visit(m)


def test_every_part_is_a_package_and_every_package_is_a_part():
    """One subpackage per part: the only top-level modules are the shared base (errors, atomic, bounded, properties)."""
    top = {p.stem if p.is_file() else p.name for p in (SRC / "quantmatrix").iterdir()
           if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert top == set(RANK)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_and_function_sizes(module):
    path = MODULES[module]
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path} has {len(text.splitlines())} lines"
    functions = [n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    long = [f"{path}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in functions
            if n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long
