"""The lint's integer weight-only (WNA16) module check: a GPTQ, AWQ or compressed-tensors pack-quantized module's
tensors against the bits, group size, activation order and zero points its config declares.

Each producer lays the same quantities out differently (checkpoints.producers: LEAVES names them, SHAPES gives
each role's dimensions in the words below and when the producer writes it); this module reads only those tables,
the safetensors headers, and the values of the small index tensors (g_idx) and scales. Findings are
(code, module, tensor, message) tuples, which checkpoints.lint turns into its Findings.

Dimension words: `in` / `out` the layer's inputs and outputs, `in/pack` / `out/pack` packed 32 // bits to an
int32, `groups` one per group of `group_size` inputs (one for channel-wise), `2` a literal size.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping
from typing import Any

from quantmatrix.adapter.declared import IntWeights
from quantmatrix.checkpoints import producers
from quantmatrix.checkpoints.experts import Found

WNA16 = "wna16"  # the scheme module this check knows
# the scheme modules whose weights this check reads, with what their configs declare beside the weights
KINDS = {WNA16: "weight-only", "w4a8": "W4A8 FP8 (dynamic per-token activations)"}
_INT_ROLES = ("weight", "zero_point", "g_idx")  # int32 tensors (weight_shape may be I32 or I64)
_SCALE_DTYPES = {"F16": "e", "BF16": "bf16", "F32": "f"}
MAX_INDEX = 1 << 24  # g_idx entries read per module before the lint refuses the work


def ignore_patterns(qc: Mapping[str, Any]) -> list[str]:
    """GPTQ's negative `dynamic` rules (`-:REGEX`, vLLM builds those modules unquantized) and AWQ's
    modules_to_not_convert (substrings of a module name) as the lint's ignore patterns (`re:`)."""
    dynamic = qc.get("dynamic") if isinstance(qc.get("dynamic"), Mapping) else {}
    skip = ["re:" + str(k)[2:] for k in dynamic if str(k).startswith("-:")]
    return skip + ["re:.*" + re.escape(str(m)) + ".*" for m in qc.get("modules_to_not_convert") or []]


def words(producer: str, w: IntWeights) -> str:
    """The declaration in a reader's words: `gptq int4 group_size 128, activation order`."""
    return f"{producer} int{w.bits} group_size {w.group_size}" + (", activation order" if w.actorder else "")


def _needed(when: str, w: IntWeights) -> bool:
    """Whether a role the producer writes `when` (always | asymmetric | actorder) belongs in this export."""
    return when == "always" or (when == "asymmetric" and not w.symmetric) or (when == "actorder" and w.actorder)


def _read_values(t: Any, count: int, width: int) -> bytes:
    with t.file.open("rb") as fh:
        fh.seek(t.offset)
        return fh.read(count * width)


def read_scales(t: Any) -> list[float]:
    """Every value of an F16, BF16 or F32 scale tensor (checkpoints.lint_int8 reads its scales the same way)."""
    fmt = _SCALE_DTYPES[t.dtype]
    if fmt == "bf16":
        raw = _read_values(t, t.numel, 2)
        return list(struct.unpack(f"<{t.numel}f", b"".join(b"\x00\x00" + raw[i:i + 2]
                                                            for i in range(0, len(raw), 2))))
    width = 2 if fmt == "e" else 4
    return list(struct.unpack(f"<{t.numel}{fmt}", _read_values(t, t.numel, width)))


def _size(word: str, inputs: int, outputs: int, groups: int, pack: int) -> int:
    return {"in": inputs, "out": outputs, "in/pack": inputs // pack, "out/pack": outputs // pack,
            "groups": groups, "2": 2}[word]


def _io(dims: tuple[str, ...], shape: tuple[int, ...], pack: int) -> tuple[int, int]:
    """(inputs, outputs) from the packed weight's shape and its dimension words."""
    sizes = {word: n * (pack if word.endswith("/pack") else 1) for word, n in zip(dims, shape, strict=True)}
    return (sizes.get("in", sizes.get("in/pack", 0)), sizes.get("out", sizes.get("out/pack", 0)))


def _g_idx(module: str, leaf: str, t: Any, w: IntWeights, inputs: int, groups: int) -> list[Found]:
    """g_idx holds each input's group: in range, `group_size` inputs a group (a permutation of the plain grid's
    indices), and the plain grid itself when the config declares no activation order (vLLM then ignores it)."""
    if t.numel > MAX_INDEX:
        return [("bad_shape", module, leaf, f"has {t.numel} entries, over the {MAX_INDEX} this lint reads")]
    values = struct.unpack(f"<{t.numel}i", _read_values(t, t.numel, 4))
    size = inputs if w.group_size == -1 else w.group_size
    bad = [v for v in values if not 0 <= v < groups]
    if bad:
        return [("bad_value", module, leaf, f"{len(bad)} of {inputs} entries outside the {groups} groups "
                 f"(e.g. {bad[0]})")]
    counts = [0] * groups
    for v in values:
        counts[v] += 1
    want = [min(size, inputs - g * size) for g in range(groups)]
    if counts != want:
        off = [(g, c, n) for g, (c, n) in enumerate(zip(counts, want, strict=True)) if c != n]
        g, c, n = off[0]
        return [("bad_value", module, leaf, f"is not a permutation of the group grid: group {g} holds {c} inputs, "
                 f"not {n} ({len(off)} of {groups} groups wrong); the kernel would scale inputs with another "
                 "group's scale")]
    if not w.actorder and list(values) != [i // size for i in range(inputs)]:
        return [("bad_value", module, leaf, "orders the inputs, but the config declares no activation order: "
                 "vLLM reads the plain grid i // group_size and ignores it")]
    return []


def _shapes(module: str, leaves: Mapping[str, Any], names: Mapping[str, str],
            dims: Mapping[str, tuple[tuple[str, ...], str]], w: IntWeights) -> list[Found]:
    """Dtypes, the group grid and every tensor's shape against the packed weight's, g_idx's values."""
    out: list[Found] = []
    pack = 32 // w.bits if w.bits in (2, 4, 8) else 0
    if not pack:
        return [("config", module, "", f"declares {w.bits}-bit weights; packed int32 holds 2, 4 or 8")]
    t = leaves.get(names["weight"])
    if t is None:
        return []
    if t.dtype != "I32" or len(t.shape) != len(dims["weight"][0]):
        return [("bad_dtype" if t.dtype != "I32" else "bad_shape", module, names["weight"],
                 f"is {t.dtype} {list(t.shape)}; packed int{w.bits} is I32 {list(dims['weight'][0])}")]
    inputs, outputs = _io(dims["weight"][0], t.shape, pack)
    size = inputs if w.group_size == -1 else w.group_size
    groups = math.ceil(inputs / size) if size > 0 else 0
    if size <= 0 or inputs % size:
        out.append(("bad_shape", module, names["block_scale"], f"group_size {w.group_size} does not divide the "
                    f"{inputs} inputs of {names['weight']} {list(t.shape)}: vLLM's kernels need whole groups"))
    for role, (shape_words, _) in dims.items():
        leaf, t = names[role], leaves.get(names[role])
        if role == "weight" or t is None:
            continue
        want = tuple(_size(word, inputs, outputs, groups, pack) for word in shape_words)
        if role in _INT_ROLES and t.dtype != "I32":
            out.append(("bad_dtype", module, leaf, f"is {t.dtype}; it is I32"))
        elif role == "block_scale" and t.dtype not in _SCALE_DTYPES:
            out.append(("bad_dtype", module, leaf, f"is {t.dtype}; scales are F16, BF16 or F32"))
        elif tuple(t.shape) != want:
            out.append(("bad_shape", module, leaf, f"is {list(t.shape)}, expected {list(want)} "
                        f"({' x '.join(shape_words)} for {inputs} inputs, {outputs} outputs, group_size "
                        f"{w.group_size}, {w.bits} bits)"))
        elif role == "g_idx":
            out += _g_idx(module, leaf, t, w, inputs, groups)
    return out


def check_module(module: str, leaves: Mapping[str, Any], producer: str, w: IntWeights,
                 scale_values: bool, scheme: str = WNA16) -> list[Found]:
    """One module of an integer-weight export: the roles its producer writes for this config present (and no
    others), each shape from the packed weight's and the declared bits and group size, g_idx a permutation of the
    group grid, and (`scale_values`) every scale finite and > 0. `scheme`: the scheme module whose names and shapes
    apply (wna16; w4a8, the same weights beside dynamically quantized activations)."""
    names, dims = producers.leaves(producer, scheme), producers.shapes(producer, scheme)
    out: list[Found] = []
    kind = KINDS[scheme]
    said = f"{kind} " + words(producer, w)
    for role, (_, when) in dims.items():
        leaf = names[role]
        if _needed(when, w) and leaf not in leaves:
            out.append(("missing_tensor", module, leaf, f"missing; the config declares {said}"))
        elif not _needed(when, w) and leaf in leaves:
            out.append(("unexpected_tensor", module, leaf, f"present, but the config declares {said} "
                        f"(it writes {leaf} only {when})"))
    known = {names[r] for r in dims}
    for leaf in sorted(set(leaves) - known - {"bias"}):
        out.append(("unexpected_tensor", module, leaf, f"not part of a {producer} {kind} integer module"))
    out += _shapes(module, leaves, names, dims, w)
    scale = leaves.get(names["block_scale"])
    if scale_values and scale is not None and scale.dtype in _SCALE_DTYPES and scale.numel <= MAX_INDEX:
        values = read_scales(scale)
        bad = sum(1 for v in values if not math.isfinite(v) or v <= 0)
        if bad:
            out.append(("bad_value", module, names["block_scale"], f"{bad} of {len(values)} scales are not "
                        "finite and > 0"))
    return out
