"""The lint's MXFP4 module check: a gpt-oss experts module (`<layer>.mlp.experts`) against config.json's sizes.

Each fused projection (gate_up_proj: 2*ffn outputs of hidden inputs, gate and up interleaved; down_proj: hidden
outputs of ffn inputs) is stored as `<proj>_blocks` U8 [experts, out, in/32, 16] (two E2M1 codes a byte) and
`<proj>_scales` U8 [experts, out, in/32] (one E8M0 exponent byte per block of 32 inputs), beside a bf16
`<proj>_bias` [experts, out]. vLLM's gpt-oss loader views the blocks as [E, out, in/2] and copies whatever fits
into its w13 / w2 parameters: a scale grid one block short, or blocks for another size, loads without a word.
Findings are (code, module, tensor, message) tuples, which checkpoints.lint turns into its Findings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from quantmatrix.checkpoints import producers
from quantmatrix.checkpoints.experts import Found

MXFP4 = "mxfp4"  # the scheme module this check knows
MXFP4_BLOCK = 32  # inputs per E8M0 scale
MAX_SCALES = 1 << 26  # scale bytes read per tensor before the lint skips the value check
E2M1_MAX = 6.0  # the largest MXFP4 element: with it, E8M0 bytes 253 and 254 overflow bf16
_BF16_MAX_LOG2 = 128  # bf16's largest finite value is just under 2**128
# projection -> (output, input) in config sizes
_SHAPES = {"gate_up_proj": ("2*ffn", "hidden"), "down_proj": ("hidden", "ffn")}


def _mxfp4_sizes(config: Mapping[str, Any]) -> dict[str, int]:
    ffn, hidden = config.get("intermediate_size"), config.get("hidden_size")
    experts = config.get("num_local_experts", config.get("num_experts"))
    ok = all(type(v) is int and v > 0 for v in (ffn, hidden, experts))
    return {"ffn": ffn, "2*ffn": 2 * ffn, "hidden": hidden, "experts": experts} if ok else {}


def e8m0_bad_bytes(element_max: float) -> dict[int, str]:
    """The E8M0 bytes no healthy export of a format whose largest element is `element_max` holds: 255 is E8M0's
    NaN; a byte whose 2**(b - 127) times element_max overflows bf16 is overflowing; 0 is 2**-127, below float32's
    normal range (a zeroed or underflowed scale: the block decodes to ~0)."""
    first = 127 + _BF16_MAX_LOG2 - math.floor(math.log2(element_max))
    return {255: "NaN", **dict.fromkeys(range(first, 255), "overflowing"), 0: "2**-127 (zeroed)"}


def bad_bytes(t: Any, element_max: float = E2M1_MAX) -> dict[str, int]:
    """Counts of the out-of-range E8M0 bytes (e8m0_bad_bytes) among a U8 scale tensor's values."""
    with t.file.open("rb") as fh:
        fh.seek(t.offset)
        raw = fh.read(t.numel)
    counts: dict[str, int] = {}
    for byte, word in e8m0_bad_bytes(element_max).items():
        n = raw.count(bytes([byte]))
        if n:
            counts[word] = counts.get(word, 0) + n
    return counts


def _projection(module: str, leaves: Mapping[str, Any], proj: str, producer: str, sizes: dict[str, int],
                scale_values: bool) -> list[Found]:
    names = producers.producer(producer).RECIPES[MXFP4]
    blocks_leaf, scales_leaf = names.leaf(proj, "weight"), names.leaf(proj, "block_scale")
    blocks, scales = leaves.get(blocks_leaf), leaves.get(scales_leaf)
    out: list[Found] = [("missing_tensor", module, leaf, "missing; the config declares MXFP4 experts")
                        for leaf, t in ((blocks_leaf, blocks), (scales_leaf, scales)) if t is None]
    for leaf, t in ((blocks_leaf, blocks), (scales_leaf, scales)):
        if t is not None and t.dtype != "U8":
            out.append(("bad_dtype", module, leaf, f"is {t.dtype}; MXFP4 blocks and E8M0 scales are U8"))
    if sizes and blocks is not None:
        rows, cols = (sizes[k] for k in _SHAPES[proj])
        want = (sizes["experts"], rows, -(-cols // MXFP4_BLOCK), MXFP4_BLOCK // 2)
        if blocks.shape != want:
            out.append(("bad_shape", module, blocks_leaf, f"is {list(blocks.shape)}; config.json sizes make "
                        f"{proj} [experts, {rows}, {cols}/32, 16] = {list(want)}"))
    if blocks is not None and scales is not None and len(blocks.shape) == 4 and scales.shape != blocks.shape[:3]:
        out.append(("bad_shape", module, scales_leaf, f"is {list(scales.shape)}, expected "
                    f"{list(blocks.shape[:3])}: one E8M0 scale per 32-input block of {blocks_leaf}"))
    elif scale_values and scales is not None and scales.dtype == "U8" and scales.numel <= MAX_SCALES:
        bad = bad_bytes(scales)
        if bad:
            said = ", ".join(f"{n} {word}" for word, n in sorted(bad.items()))
            out.append(("bad_value", module, scales_leaf, f"{said} of {scales.numel} E8M0 scales"))
    return out


def check_mxfp4_module(module: str, leaves: Mapping[str, Any], producer: str, config: Mapping[str, Any],
                 scale_values: bool) -> list[Found]:
    """One gpt-oss experts module: both fused projections' blocks and scales present, U8, shaped from the
    config's sizes and each other, (`scale_values`) no E8M0 scale outside a weight's range; nothing else."""
    sizes = _mxfp4_sizes(config)
    out: list[Found] = []
    known = {"gate_up_proj_bias", "down_proj_bias"}
    for proj in _SHAPES:
        out += _projection(module, leaves, proj, producer, sizes, scale_values)
        names = producers.producer(producer).RECIPES[MXFP4]
        known |= {names.leaf(proj, "weight"), names.leaf(proj, "block_scale")}
    for leaf in sorted(set(leaves) - known):
        out.append(("unexpected_tensor", module, leaf, f"not part of a {producer} MXFP4 experts module"))
    return out
