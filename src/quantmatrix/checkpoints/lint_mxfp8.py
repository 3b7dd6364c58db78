"""The lint's MXFP8 module check: one quantized Linear of a ModelOpt MXFP8 export (quant_algo MXFP8).

A module holds `weight` F8_E4M3 [out, in] and `weight_scale` U8 [out, in/32] (one E8M0 exponent byte per block of
32 inputs), and no input_scale: vLLM's ModelOptMxFp8FusedMoE (0.32) creates w13/w2_weight and w13/w2_weight_scale
only, and its weight_loader copies a scale grid one block short into the front of the parameter without a word,
leaving the last block's scale whatever the buffer held. Findings are (code, module, tensor, message) tuples, which
checkpoints.lint turns into its Findings; the E8M0 byte range is checkpoints.lint_mxfp4's, for E4M3's 448.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantmatrix.adapter.declared import MXFP8  # the scheme module this check knows
from quantmatrix.checkpoints import lint_mxfp4, producers
from quantmatrix.checkpoints.experts import Found

BLOCK = 32  # inputs per E8M0 scale
E4M3_MAX = 448.0


def check_mxfp8_module(module: str, leaves: Mapping[str, Any], producer: str, scale_values: bool) -> list[Found]:
    """One MXFP8 Linear: weight and scale present, F8_E4M3 [out, in] with whole blocks of 32 inputs and U8
    [out, in/32], (`scale_values`) no E8M0 scale outside E4M3's range; nothing else."""
    names = producers.leaves(producer, MXFP8)
    weight, scale = names["weight"], names["block_scale"]
    out: list[Found] = [("missing_tensor", module, leaf, "missing; the config declares MXFP8")
                        for leaf in (weight, scale) if leaf not in leaves]
    for leaf in sorted(set(leaves) - {weight, scale} - {"bias"}):
        why = ": vLLM's MXFP8 method never reads one, so the export and its config disagree about the activations" \
            if producers.role_of(leaf) == "input_scale" else ""
        out.append(("unexpected_tensor", module, leaf, f"not part of a {producer} MXFP8 module{why}"))
    w, s = leaves.get(weight), leaves.get(scale)
    if w is not None and (w.dtype != "F8_E4M3" or len(w.shape) != 2 or w.shape[1] % BLOCK):
        code = "bad_dtype" if w.dtype != "F8_E4M3" else "bad_shape"
        out.append((code, module, weight, f"is {w.dtype} {list(w.shape)}; MXFP8 weights are F8_E4M3 [out, in], "
                    f"in a multiple of {BLOCK}"))
        w = None
    if s is None:
        return out
    if s.dtype != "U8":
        out.append(("bad_dtype", module, scale, f"is {s.dtype}; E8M0 scales are U8"))
    elif w is not None and s.shape != (w.shape[0], w.shape[1] // BLOCK):
        out.append(("bad_shape", module, scale, f"is {list(s.shape)}, expected {[w.shape[0], w.shape[1] // BLOCK]}:"
                    f" one E8M0 scale per {BLOCK}-input block of {weight} {list(w.shape)}"))
    elif scale_values and s.numel <= lint_mxfp4.MAX_SCALES:
        bad = lint_mxfp4.bad_bytes(s, E4M3_MAX)
        if bad:
            said = ", ".join(f"{n} {word}" for word, n in sorted(bad.items()))
            out.append(("bad_value", module, scale, f"{said} of {s.numel} E8M0 scales"))
    return out
