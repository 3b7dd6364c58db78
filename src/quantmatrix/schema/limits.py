"""What a matrix may cost before anything is expanded, each limit named with its file:line when crossed: nodes of
the YAML graph with every alias expanded (a 30 KB file repeating one alias 1,500 times is millions of values),
selectors, cells, the width of a label, an id or a name, an environment value; and the selector and waiver rules
that keep a matrix from silently meaning nothing or everything. docs/matrix.md states every number."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import yaml

from quantmatrix.errors import MatrixError
from quantmatrix.schema.model import Selector
from quantmatrix.schema.yamldoc import Doc

MAX_NODES = 200_000  # YAML values, aliases expanded (default.yaml: ~3,000)
MAX_SELECTORS = 1_000  # include + exclude entries: each is matched against every cell
MAX_CELLS = 20_000  # checkpoints x archs x modes x layouts, unless the matrix raises it with `max_cells:`
LABEL_CHARS = 200  # a label: one line of `quantmatrix list` and the nightly page
ID_CHARS = 100  # a checkpoint id (a directory name in the cache, part of every case id)
NAME_CHARS = 64  # an arch, mode, scheme or check name, a marker
CELL_KEYS = ("checkpoint", "arch", "mode", "scheme", "producer")  # what a cell has; `check` is a case's


def expanded_nodes(root: yaml.Node) -> int:
    """How many values the document holds with every alias expanded, counted without expanding: each distinct
    node once, its expanded size memoised (iterative, so a deep file cannot exhaust the stack)."""
    size: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in size:
            continue
        kids = _children(node)
        if done or not kids:
            size[id(node)] = min(1 + sum(size[id(k)] for k in kids), 1 << 62)
            continue
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in size)
    return size[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def check_nodes(path: object, root: yaml.Node) -> None:
    n = expanded_nodes(root)
    if n > MAX_NODES:
        raise MatrixError(f"{path}:1:1: the matrix expands to {n} YAML values (aliases expanded), over the "
                          f"{MAX_NODES} a matrix may hold; repeat less through aliases")


def text_at_most(chars: int, what_kind: str) -> Callable[[Doc, yaml.Node, str], str]:
    """A string converter that refuses more than `chars` characters or a line break (a label is one line)."""
    def convert(doc: Doc, node: yaml.Node, what: str) -> str:
        value = doc.typed(node, what, (str,), "a string")
        if len(value) > chars or "\n" in value or "\r" in value:
            broken = " with a line break" if "\n" in value or "\r" in value else ""
            raise doc.error(node, f"{what}: {what_kind} is one line of at most {chars} characters, got "
                                  f"{len(value)}{broken}")
        return value
    return convert


def check_selectors(doc: Doc, node: yaml.Node, what: str, selector: Selector, cell: bool) -> None:
    """A cell selector (include, exclude, a check's cells) may not name `check`: a cell has none, so it would
    match nothing, silently. A waiver must name a check or a checkpoint (not only `*`): `match: {}` or
    `{arch: sm121}` would waive every case of a whole arch."""
    if cell and "check" in selector.patterns:
        raise doc.error(node, f"{what}: `check` selects cases, and {what.split('[')[0]} selects cells (by "
                              f"{', '.join(CELL_KEYS)}): it would match nothing; waivers[].match takes `check`")
    if not cell and not any(p != "*" for k in ("check", "checkpoint") for p in selector.patterns.get(k, ())):
        raise doc.error(node, f"{what}: a waiver must name a check or a checkpoint (it names "
                              f"{', '.join(selector.patterns) or 'nothing'}): it would waive every case of "
                              "everything else it matches")


def check_cells(doc: Doc, top: Mapping[str, Any], counts: Iterable[int], max_cells: int | None,
                selectors: int) -> None:
    """checkpoints x archs x modes x layouts (the serving one and the declared ones) within the budget, include +
    exclude within theirs, before any expansion."""
    product = 1
    for n in counts:
        product *= n
    limit = max_cells or MAX_CELLS
    if product > limit:
        raise doc.error(top["@checkpoints"], f"the matrix has {product} cells (checkpoints x archs x modes x "
                                             f"layouts), over its max_cells of {limit}; raise `max_cells:` if that "
                                             "is meant")
    if selectors > MAX_SELECTORS:
        raise MatrixError(f"{doc.path}: include and exclude hold {selectors} selectors, over the {MAX_SELECTORS} "
                          "matched against every cell")
