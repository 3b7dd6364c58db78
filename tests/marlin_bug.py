"""A hand-made vLLM bug in the Marlin MoE conversion, for proving that the cpu tier's kernel_format catches it by
tensor: the grouped scales permuted with the wrong size.

vLLM's WNA16 Marlin conversion (fused_moe/oracle/int_wna16.py) calls `marlin_moe_permute_scales(s, size_k, ...)`,
which picks Marlin's grouped layout only where `group_size < size_k`. The bug hands it size_k = the scales' group
rows x the INT4 pack factor (8) instead of x the group size, as a GPTQ Marlin MoE once computed w2's: with groups
of 32, size_k comes out as 32 or less, so every expert's grouped scales are laid out per-channel while every shape
still fits (a W4A16 MoE that scores 0 on GSM8K, with no error anywhere). Installed with tests/vllm_patch.py in a
child pytest and its rank processes only.
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
