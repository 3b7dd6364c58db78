"""GPTQ (AutoGPTQ / GPTQModel, checkpoint_format "gptq") as a producer of WNA16 checkpoints: its names, its int32
packing and its `quantization_config` (config.json, repeated in quantize_config.json as GPTQ writes it).

<m>.qweight I32 [in / (32/bits), out]: codes packed along the inputs, slot k = input 8j+k (4-bit);
<m>.qzeros I32 [groups, out / (32/bits)]: zero points minus one (GPTQ's v1 format) packed along the outputs;
<m>.scales F16 [groups, out]; <m>.g_idx I32 [in]: the group of each input (a permutation of the plain grid's
when desc_act). Symmetric only (vLLM serves GPTQ as uint4b8 / uint8b128).
"""

from __future__ import annotations

from typing import Any

import torch

from quantmatrix.checkpoints.configs import excluded_modules
from quantmatrix.checkpoints.schemes.wna16 import Quantized, pack_int32, params
from quantmatrix.schema.synthetic import SyntheticSpec

LEAVES = {"wna16": {"weight": "qweight", "zero_point": "qzeros", "block_scale": "scales", "g_idx": "g_idx"}}
# role -> (its dimensions in checkpoints.lint_wna16's words, when GPTQ writes it): vLLM registers all four
SHAPES = {"wna16": {"weight": (("in/pack", "out"), "always"), "zero_point": (("groups", "out/pack"), "always"),
                    "block_scale": (("groups", "out"), "always"), "g_idx": (("in",), "always")}}
# how its codes sit in an int32 and what its stored zero points mean (measure.dequant decodes by it)
PACKING = {"wna16": {"slot_order": "sequential", "zero_offset": 1}}  # qzeros hold zero - 1 (v1 format)


class _WNA16:
    """GPTQ's layout (schemes.wna16.Export)."""

    symmetric = True
    scale_dtype = torch.float16

    @staticmethod
    def tensors(q: Quantized, spec: SyntheticSpec) -> dict[str, torch.Tensor]:
        del spec  # GPTQ always writes g_idx, in one layout
        return {"weight": pack_int32(q.codes.T, q.bits, 0),
                "zero_point": pack_int32(q.zero.T - 1, q.bits, 1),
                "block_scale": q.scale.T.to(torch.float16).contiguous(),
                "g_idx": q.g_idx.to(torch.int32)}


RECIPES = {"wna16": _WNA16()}


def quantization_config(spec: SyntheticSpec) -> dict[str, Any]:
    """GPTQModel's quantization_config: bits, group_size, desc_act, sym, and the modules left unquantized as
    negative `dynamic` rules (vLLM builds those unquantized)."""
    p = params(spec)
    skip = {"-:" + ".*" + g.replace(".", r"\.").replace("*", ".*") + ".*": {} for g in excluded_modules(spec)}
    return {"quant_method": "gptq", "bits": p.bits, "group_size": p.group_size, "desc_act": p.actorder,
            "sym": True, "damp_percent": 0.01, "static_groups": False, "true_sequential": True,
            "checkpoint_format": "gptq", "lm_head": False, "dynamic": skip}


def config_files(spec: SyntheticSpec, plain: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    qc = quantization_config(spec)
    return {**plain, "config.json": {**plain["config.json"], "quantization_config": qc},
            "quantize_config.json": qc}
