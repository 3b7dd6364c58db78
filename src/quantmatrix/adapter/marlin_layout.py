"""Marlin's scale layout, restated from the kernel's tiling and never taken from vLLM's helpers (it imports nothing of
vLLM's): adapter.kernel reads a converted layer's scales back through it, so the conversion is not graded against
itself.

Marlin (Frantar et al., IST-DASLab) keeps a weight's scales input-axis first, one row per quantization group of k
and one column per output n, and stores each row in the order its threads load it. Where there are several groups
along k, each thread of a warp loads one 16-byte vector of eight scales per group step, so a 64-column block is
stored as an 8 x 8 transpose: column 8a + b at position 8b + a. With one group (per-channel scales, applied once
after the whole k loop) the scales follow the accumulator fragments of the 16 x 8 MMA tiles: in a 32-column block,
column 8m + 2i + b (m, i < 4, b < 2) at position 8i + 2m + b, the pairs of adjacent columns a thread owns. Which
layout the kernel reads follows from the tensor alone, as the kernel infers it: more than one row is grouped.
"""

from __future__ import annotations

from typing import Any

LAYOUTS = ("grouped", "per-channel")


def layout_of(scales: Any) -> str:
    """The layout Marlin reads a [groups, n] scale tensor in (16-bit activations): grouped for more than one group."""
    return "grouped" if scales.shape[0] > 1 else "per-channel"


def unpermute(scales: Any, layout: str) -> Any:
    """The [groups, n] scales in column order, from their Marlin storage order in `layout` (the flattened tensor in
    blocks of 64 columns, grouped, or 32, per-channel)."""
    if layout == "grouped":
        return scales.reshape(-1, 8, 8).transpose(1, 2).reshape(scales.shape)
    if layout == "per-channel":
        return scales.reshape(-1, 4, 4, 2).transpose(1, 2).reshape(scales.shape)
    raise ValueError(f"unknown Marlin scale layout {layout!r}: one of {LAYOUTS}")


def fits(scales: Any, layout: str) -> bool:
    """Whether the tensor is a whole number of the layout's blocks (64 columns grouped, 32 per-channel)."""
    return scales.numel() % (64 if layout == "grouped" else 32) == 0
