"""What a Python statement binds, reads and imports, and how to cut and edit its text: the lifter's (repro.lift)
questions about source code, answered from ast and symtable alone."""

from __future__ import annotations

import ast
import symtable


def is_import(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return True
    inner = [s for s in ast.walk(stmt) if isinstance(s, ast.stmt) and s is not stmt]
    return isinstance(stmt, (ast.If, ast.Try)) and bool(inner) and all(
        isinstance(s, (ast.Import, ast.ImportFrom, ast.Pass, ast.Expr)) for s in inner)


def bound_by(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    if isinstance(stmt, (ast.If, ast.Try)) and is_import(stmt):
        return [n for s in ast.walk(stmt) if isinstance(s, (ast.Import, ast.ImportFrom)) for n in bound_by(s)]
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
        stmt, ast.AnnAssign) else []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def absolute(stmt: ast.ImportFrom, here: str) -> str:
    if not stmt.level:
        return stmt.module or ""
    base = here.split(".")[: -stmt.level]
    return ".".join(base + ([stmt.module] if stmt.module else []))


_COMPREHENSIONS = {"genexpr", "listcomp", "setcomp", "dictcomp"}


def global_names(text: str, name: str) -> tuple[set[str], set[str]]:
    """(global names used at run time, global names evaluated when the statement itself runs: at module level,
    in a class body, in a comprehension there; never inside a function or lambda body)."""
    runtime: set[str] = set()
    deftime: set[str] = set()

    def walk(t: symtable.SymbolTable, evaluated: bool) -> None:
        top = t.get_type() == "module"
        for s in t.get_symbols():
            used = s.is_referenced() or (s.is_assigned() and s.is_global() and not top)
            if used and (top or s.is_global()):
                runtime.add(s.get_name())
                if evaluated and s.is_referenced():
                    deftime.add(s.get_name())
        for child in t.get_children():
            now = evaluated and (child.get_type() == "class" or child.get_name() in _COMPREHENSIONS)
            walk(child, now)

    walk(symtable.symtable(text, "<lift>", "exec"), True)
    return runtime - {name}, deftime - {name}


def local_names(text: str) -> set[str]:
    """Every name a function or class body of `text` binds locally (parameters included)."""
    out: set[str] = set()

    def walk(t: symtable.SymbolTable) -> None:
        if t.get_type() != "module":
            out.update(s.get_name() for s in t.get_symbols() if s.is_local() or s.is_parameter())
        for child in t.get_children():
            walk(child)

    walk(symtable.symtable(text, "<lift>", "exec"))
    return out


class NoAnnotations(ast.NodeTransformer):
    """Annotations are strings in the script (`from __future__ import annotations`): never a name it needs."""

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.returns = None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None:
            return ast.copy_location(ast.Pass(), node)
        return ast.copy_location(ast.Assign(targets=[node.target], value=self.visit(node.value)), node)


def annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside an annotation (left as text: the script never evaluates them)."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(n) for root in roots for n in ast.walk(root)}


def binding(stmt: ast.stmt, name: str, text: str) -> str:
    """What an import binds `name` to: `module` or `module:attr` (two spellings of one binding agree)."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Import):
            for a in node.names:
                if (a.asname or a.name.split(".")[0]) == name:
                    return a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if (a.asname or a.name) == name:
                    return f"{node.module}:{a.name}"
    return ast.get_source_segment(text, stmt) or name


def is_attribute_base(tree: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(n, ast.Attribute) and n.value is name for n in ast.walk(tree))


def apply_edits(text: str, edits: list[tuple[int, int, int, int, str]]) -> str:
    lines = text.splitlines(keepends=True)
    for line, col, end_line, end_col, new in sorted(edits, reverse=True):
        head, tail = lines[line - 1][:col], lines[end_line - 1][end_col:]
        lines[line - 1: end_line] = [head + new + tail]
    return "".join(lines)


def import_order(statement: str) -> tuple[int, str]:
    return (0 if statement.startswith("from __future__") else 1, statement)
