"""Parallel layouts, a matrix axis like archs and modes: how a checkpoint's model is split over ranks (tensor
parallel, expert parallel). Every checkpoint is checked in the layout it is served in (its `gpus`); a matrix's
`layouts:` add others, each for the cells its selectors pick. The checks measured rank by rank say
`layouts: every`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import yaml

from quantmatrix.schema.yamldoc import Doc, Field, as_bool, int_at_least, one_of

SCOPES = ("serving", "every")  # the layouts a check runs under: the checkpoint's serving one, or every one


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a model is split over ranks: `tp` tensor-parallel ranks, each holding a slice of every expert, or with
    `ep` the same ranks each holding whole experts (vLLM's enable_expert_parallel). A layout is what it is, (tp, ep);
    `cells` / `except_cells` only say which cells a matrix checks under it besides their serving layout."""

    tp: int = 1
    ep: bool = False
    cells: tuple[Any, ...] = dataclasses.field(default=(), compare=False)  # schema.model.Selector
    except_cells: tuple[Any, ...] = dataclasses.field(default=(), compare=False)

    @property
    def name(self) -> str:
        """Its marker and cell-id part: tp2, tp2_ep."""
        return f"tp{self.tp}{'_ep' if self.ep else ''}"

    @property
    def ranks(self) -> int:
        return self.tp

    def describe(self) -> str:
        if self.tp == 1:
            return "one rank"
        return f"{self.tp} ranks, {'whole experts per rank (expert parallel)' if self.ep else 'tensor parallel'}"

    def selects(self, cell: Any) -> bool:
        """Whether the matrix checks `cell` (a schema.model.Cell) in this layout."""
        if self.cells and not any(s.matches(cell) for s in self.cells):
            return False
        return not any(s.matches(cell) for s in self.except_cells)


CHECK_FIELD = Field(one_of(SCOPES), "serving (the checkpoint's serving layout, default) or every (each layout the "
                    "matrix checks, rank by rank)", required=False, default="serving")  # a check's `layouts`

FIELDS = {
    "tp": Field(int_at_least(1), "ranks (tensor_parallel_size)"),
    "ep": Field(as_bool, "experts split whole over the ranks (enable_expert_parallel)", required=False,
                default=False),
    "cells": Field(lambda d, n, w: n, "cell selectors checked in this layout (default: all)", required=False),
    "except_cells": Field(lambda d, n, w: n, "cell selectors not checked in it", required=False),
}


def parse(doc: Doc, nodes: tuple[yaml.Node, ...]) -> list[tuple[Layout, dict[str, Any], str]]:
    """The declared layouts with their records (their selectors are resolved once the checkpoints are known)."""
    seen: dict[str, str] = {}
    out = []
    for i, node in enumerate(nodes):
        what = f"layouts[{i}]"
        r = doc.record(node, what, FIELDS)
        layout = Layout(r["tp"], r["ep"])
        if layout.ep and layout.tp < 2:
            raise doc.error(r["@ep"], f"{what}.ep: expert parallel needs at least 2 ranks (tp >= 2)")
        if layout.name in seen:
            raise doc.error(node, f"duplicate layout {layout.name!r} (already defined at {seen[layout.name]})")
        seen[layout.name] = doc.where(node)
        out.append((layout, r, what))
    return out


def narrowed(doc: Doc, declared: list[tuple[Layout, dict[str, Any], str]],
             many: Callable[[list[yaml.Node], str], tuple[Any, ...]]) -> tuple[Layout, ...]:
    """The declared layouts with their selectors resolved by `many` (schema.load's, which knows the names)."""
    return tuple(dataclasses.replace(lay, **{key: many(doc.sequence(r[key], f"{what}.{key}"), f"{what}.{key}")
                                             for key in ("cells", "except_cells") if r[key] is not None})
                 for lay, r, what in declared)


def names(declared: list[tuple[Layout, dict[str, Any], str]], checkpoints: Any) -> list[str]:
    """Every layout name a selector may use: the declared layouts' and the checkpoints' serving ones."""
    return list(dict.fromkeys([*(lay.name for lay, _, _ in declared), *(c.serving.name for c in checkpoints)]))
