"""The lint's W8A8 INT8 module check (compressed-tensors int-quantized): an int8 weight, one scale per output
channel, and nothing for the activations, which vLLM's INT8 MoE quantizes itself per token.

What vLLM 0.32 accepts (CompressedTensorsW8A8Int8MoEMethod): channel-wise weights with dynamic per-token
activations only (it raises on static input scales), symmetric weights (no zero point), int8 weight parameters
and float32 [E, N, 1] scale parameters it copies the checkpoint's scales into whatever their dtype. Findings are
(code, module, tensor, message) tuples, which checkpoints.lint turns into its Findings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from quantmatrix.checkpoints import producers
from quantmatrix.checkpoints.experts import Found
from quantmatrix.checkpoints.lint_wna16 import MAX_INDEX, read_scales

INT8 = "int8"  # the scheme module this check knows
_INT8_SCALE_DTYPES = ("F32", "BF16", "F16")


def _scale(module: str, leaf: str, t: Any, rows: int | None, values: bool) -> list[Found]:
    """The weight scale: a float dtype, one per output row ([out, 1] or [out]), each finite and > 0."""
    if t.dtype not in _INT8_SCALE_DTYPES:
        return [("bad_dtype", module, leaf, f"is {t.dtype}; INT8 weight scales are {', '.join(_INT8_SCALE_DTYPES)} "
                 "(vLLM copies them into float32 without a word, rounding whatever this dtype held)")]
    if rows is not None and tuple(t.shape) not in ((rows, 1), (rows,)):
        return [("bad_shape", module, leaf, f"is {list(t.shape)}, expected [{rows}, 1]: one scale per output "
                 "channel (vLLM's INT8 MoE takes channel-wise weights only)")]
    if values and t.numel <= MAX_INDEX:
        got = read_scales(t)
        bad = sum(1 for v in got if not math.isfinite(v) or v <= 0)
        if bad:
            return [("bad_value", module, leaf, f"{bad} of {len(got)} scales are not finite and > 0")]
    return []


def check_int8_module(module: str, leaves: Mapping[str, Any], producer: str, scale_values: bool) -> list[Found]:
    """One W8A8 INT8 module: weight and scale present, no activation scale or zero point, an I8 [out, in] weight
    and its per-channel scale."""
    names = producers.leaves(producer, INT8)
    weight, scale = names["weight"], names["block_scale"]
    out: list[Found] = []
    for leaf in (weight, scale):
        if leaf not in leaves:
            out.append(("missing_tensor", module, leaf, "missing; the config declares W8A8 INT8"))
    why = {names["input_scale"]: "the config declares dynamic per-token activations: vLLM's INT8 MoE has no "
                                 "input-scale parameter (it refuses static activation scales)",
           names["zero_point"]: "the config declares symmetric weights, and vLLM's INT8 MoE takes no zero point"}
    for leaf in sorted(set(leaves) - {weight, scale, "bias"}):
        out.append(("unexpected_tensor", module, leaf, f"present, but {why[leaf]}" if leaf in why else
                    f"not part of a {producer} W8A8 INT8 module"))
    w, rows = leaves.get(weight), None
    if w is not None:
        if w.dtype != "I8" or len(w.shape) != 2:
            out.append(("bad_dtype" if w.dtype != "I8" else "bad_shape", module, weight,
                        f"is {w.dtype} {list(w.shape)}; INT8 weights are I8 [out, in]"))
        else:
            rows = w.shape[0]
    if scale in leaves:
        out += _scale(module, scale, leaves[scale], rows, scale_values)
    return out
