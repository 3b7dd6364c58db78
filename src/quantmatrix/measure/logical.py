"""The logical form of a packed integer checkpoint's tensors (WNA16: GPTQ, AWQ, compressed-tensors W4A16/W8A16):
codes, zero points and scales as [out, in or groups], the way the format defines them, whatever int32 packing,
slot order or transpose a producer stores them in (its SHAPES and PACKING, unpacked by vLLM's own packing helpers:
measure.dequant.oriented). The reference split (measure.split) slices this form, so that a rank is held to its
part of the weight itself, not of one producer's byte layout; the loaded parameters are read back into the same
form (adapter.wna16.logical_param)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantmatrix.checkpoints import producers

_PACKED_ROLES = ("weight", "zero_point", "block_scale")  # the roles a producer may pack or transpose


@dataclasses.dataclass(frozen=True)
class Logical:
    bits: int
    roles: Mapping[str, str]  # leaf -> role, for this producer's tensors of the family
    words: Mapping[str, tuple[str, ...]]  # role -> its dimension words (producers' SHAPES)
    slot_order: str
    zero_offset: int

    @classmethod
    def of(cls, path: Path) -> Logical | None:
        """The logical form of the checkpoint at `path`, None when it holds no packed integer weights."""
        from quantmatrix.checkpoints.lint_config import declared

        if not (path / "config.json").is_file():
            return None  # bare tensors (a test's hand-made files): nothing declares them packed
        d = declared(path)[0]
        if d.weights is None:
            return None
        pk = producers.packing(d.producer, d.family)
        return cls(d.weights.bits, {lf: role for role, lf in producers.leaves(d.producer, d.family).items()},
                   {role: dims[0] for role, dims in producers.shapes(d.producer, d.family).items()},
                   str(pk.get("slot_order", "sequential")), int(pk.get("zero_offset", 0)))

    def _words(self, name: str, ndim: int) -> tuple[str, tuple[str, ...]] | None:
        role = self.roles.get(name.rpartition(".")[2], "")
        words = self.words.get(role)
        return (role, words) if role in _PACKED_ROLES and words and len(words) == ndim else None

    def shape(self, name: str, stored: tuple[int, ...]) -> tuple[int, ...]:
        known = self._words(name, len(stored))
        if known is None:
            return stored
        dims = tuple(s * (32 // self.bits) if w.endswith("/pack") else s for s, w in zip(stored, known[1], strict=True))
        return tuple(reversed(dims)) if known[1][0] in ("in", "in/pack", "groups") else dims

    def tensor(self, name: str, stored: Any) -> Any:
        from quantmatrix.measure.dequant import oriented

        known = self._words(name, stored.dim())
        if known is None:
            return stored
        values = oriented(stored, known[1], self.bits, self.slot_order)
        return values + self.zero_offset if known[0] == "zero_point" else values
