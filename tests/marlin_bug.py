"""A hand-made vLLM bug in the Marlin MoE conversion, for proving that the cpu tier's kernel_format catches it by
tensor: the grouped scales permuted with the wrong size.

vLLM's WNA16 Marlin conversion (fused_moe/oracle/int_wna16.py) calls `marlin_moe_permute_scales(s, size_k, ...)`,
which picks Marlin's grouped layout only where `group_size < size_k`. The bug hands it size_k = the scales' group
rows x the INT4 pack factor (8) instead of the projection's k: with 2 groups of 64 that is 16, so every expert's
grouped scales are laid out per-channel while every shape still fits. The real bugs had this shape: vLLM PR 13769
(compressed-tensors W4A16 MoE grouped scales permuted with the wrong size, GSM8K 0.00) and PR 50196 (GPTQ / AWQ
w13 permuted with the per-rank intermediate size as k, wrong at some tensor-parallel sizes; vLLM 0.32 still has it,
see the matrix's waivers). Installed with tests/vllm_patch.py in a child pytest and its rank processes only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import vllm_patch

INT_WNA16 = "vllm.model_executor.layers.fused_moe.oracle.int_wna16"
PACK_FACTOR = 8  # INT4 values per int32


def install(tmp: Path) -> dict[str, str]:
    """The environment under which every Python process carries the bug."""
    return {"PYTHONPATH": vllm_patch.install(tmp, {INT_WNA16: "marlin_bug.apply"})}


def apply(module: Any) -> None:
    permute = module.marlin_moe_permute_scales

    def wrong_size(s: Any, size_k: int, size_n: int, group_size: int, is_a_8bit: bool = False) -> Any:
        return permute(s, s.shape[1] * PACK_FACTOR, size_n, group_size, is_a_8bit)  # the bug

    module.marlin_moe_permute_scales = wrong_size
