"""Cell selectors as a matrix writes them (include, exclude, waivers, a check's cells / except_cells / cpu_cells):
each name without glob characters checked against what exists, so none dangles; a cpu_cells entry may also say what
host its cells need (`needs`, vocab.HOST_NEEDS). Every error names its file:line."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import yaml

from quantmatrix.schema import fields, limits
from quantmatrix.schema.model import Check, CpuCells, Selector, is_glob
from quantmatrix.schema.vocab import HOST_NEEDS
from quantmatrix.schema.yamldoc import Doc, Field, closest, list_of, one_of

NARROWING = ("cells", "except_cells", "cpu_cells")
_NEEDS = {"needs": Field(list_of(one_of(HOST_NEEDS)), "what a host running these cells on vLLM's CPU build needs "
                         f"(all of: {', '.join(HOST_NEEDS)}); a host without it skips them", required=False)}


class Selectors:
    """Selector lists, each value without glob characters checked against what exists (no dangling names)."""

    def __init__(self, doc: Doc, known: Mapping[str, list[str]]) -> None:
        self.doc, self.known = doc, known

    def one(self, node: yaml.Node, what: str, cell: bool = True) -> Selector:
        return self._entry(node, what, cell)[0]

    def many(self, nodes: list[yaml.Node] | tuple[yaml.Node, ...], what: str) -> tuple[Selector, ...]:
        return tuple(self.one(node, f"{what}[{i}]") for i, node in enumerate(nodes))

    def cpu_cells(self, nodes: list[yaml.Node] | tuple[yaml.Node, ...], what: str) -> tuple[CpuCells, ...]:
        out = []
        for i, node in enumerate(nodes):
            sel, needs = self._entry(node, f"{what}[{i}]", True, _NEEDS)
            out.append(CpuCells(sel, needs["needs"] or ()))
        return tuple(out)

    def _entry(self, node: yaml.Node, what: str, cell: bool, extra: Mapping[str, Field] | None = None
               ) -> tuple[Selector, dict[str, Any]]:
        sel, nodes, values = fields.selector(self.doc, node, what, extra)
        limits.check_selectors(self.doc, node, what, sel, cell)
        for key, pats in sel.patterns.items():
            for p in pats:
                if not is_glob(p) and p not in self.known[key]:
                    raise self.doc.error(nodes[key], f"{what}.{key}: no {key} named {p!r}"
                                                     f"{closest(p, self.known[key])}")
        if values.get("needs") == ():
            raise self.doc.error(nodes["needs"], f"{what}.needs: an empty list needs nothing; leave the key out")
        return sel, values


def narrow(doc: Doc, sel: Selectors, checks: dict[str, Check], records: list[tuple[dict[str, Any], int]]) -> None:
    """Apply each check's cells / except_cells / cpu_cells (they may name checkpoints defined after it)."""
    for r, i in records:
        given = {key: doc.sequence(r[key], f"checks[{i}].{key}") for key in NARROWING if r[key] is not None}
        cut: dict[str, Any] = {key: sel.many(nodes, f"checks[{i}].{key}") for key, nodes in given.items()
                               if key != "cpu_cells"}
        if "cpu_cells" in given:
            cut["cpu_cells"] = sel.cpu_cells(given["cpu_cells"], f"checks[{i}].cpu_cells")
        if cut.get("cpu_cells") and r["tier"] != "gpu":
            raise doc.error(r["@cpu_cells"], f"checks[{i}].cpu_cells: only a gpu-tier check has cells that run "
                                             "anywhere; this one is cpu tier already")
        checks[r["name"]] = dataclasses.replace(checks[r["name"]], **cut)
