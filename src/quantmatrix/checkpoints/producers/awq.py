"""AWQ (AutoAWQ, version "gemm") as a producer of WNA16 checkpoints: its names, its interleaved int32 packing,
zero points, and its `quantization_config`.

<m>.qweight I32 [in, out / 8]: codes packed along the OUTPUTS in AWQ's interleaved order (slot k of an int32
holds output 8j + AWQ_ORDER[k]); <m>.qzeros I32 [groups, out / 8]: zero points (asymmetric, no offset) packed
the same way; <m>.scales F16 [groups, out]. No g_idx: AWQ has no activation order.
"""

from __future__ import annotations

from typing import Any

import torch

from quantmatrix.checkpoints.configs import excluded_modules
from quantmatrix.checkpoints.schemes.wna16 import Quantized, pack_int32, params
from quantmatrix.schema.synthetic import SyntheticSpec

LEAVES = {"wna16": {"weight": "qweight", "zero_point": "qzeros", "block_scale": "scales"}}
# role -> (its dimensions in checkpoints.lint_wna16's words, when AWQ writes it)
SHAPES = {"wna16": {"weight": (("in", "out/pack"), "always"), "zero_point": (("groups", "out/pack"), "always"),
                    "block_scale": (("groups", "out"), "always")}}
# AutoAWQ's pack order for 4-bit (its gemm kernels' interleave): slot k of an int32 holds output AWQ_ORDER[k].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# synthetic zero_point_order -> slot order of qzeros; "gptq" (sequential) is a malformed export
_ZERO_ORDERS = {"awq": AWQ_ORDER, "gptq": (0, 1, 2, 3, 4, 5, 6, 7)}
# how its codes sit in an int32 and what its stored zero points mean (measure.dequant decodes by it)
PACKING = {"wna16": {"slot_order": "awq", "zero_offset": 0}}


class _WNA16:
    """AWQ's layout (schemes.wna16.Export)."""

    symmetric = False
    scale_dtype = torch.float16

    @staticmethod
    def tensors(q: Quantized, spec: SyntheticSpec) -> dict[str, torch.Tensor]:
        if params(spec).actorder or q.bits != 4:
            raise ValueError("AutoAWQ writes 4-bit weights without activation order only")
        zero_order = _ZERO_ORDERS[spec.zero_point_order or "awq"]
        return {"weight": pack_int32(q.codes.T, 4, 1, AWQ_ORDER),
                "zero_point": pack_int32(q.zero.T, 4, 1, zero_order),
                "block_scale": q.scale.T.to(torch.float16).contiguous()}


RECIPES = {"wna16": _WNA16()}


def quantization_config(spec: SyntheticSpec) -> dict[str, Any]:
    p = params(spec)
    return {"quant_method": "awq", "bits": p.bits, "group_size": p.group_size, "zero_point": True,
            "version": "gemm", "modules_to_not_convert": [g.replace("model.layers.*.", "").rstrip("*")
                                                           for g in excluded_modules(spec)]}


def config_files(spec: SyntheticSpec, plain: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {**plain, "config.json": {**plain["config.json"], "quantization_config": quantization_config(spec)}}
