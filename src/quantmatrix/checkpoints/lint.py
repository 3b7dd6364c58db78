"""Checkpoint lint: the scheme a checkpoint's config declares against the tensors its files hold, per module
and per expert.

It reads safetensors headers (and the few bytes of per-tensor scales), never the weights, so it runs on a
real 30B export in a second. The declaration is read the way vLLM reads it (weight-only when ModelOpt's
quant_algo is W4A16_NVFP4 or every config group's input_activations is None; compressed-tensors: a falsy
input_activations), so a finding is exactly a place where vLLM's kernel choice and the files disagree. The
declaration's family (the scheme module whose tensors it holds) picks the module check: NVFP4 and FP8 here, integer
weight exports (GPTQ, AWQ, compressed-tensors pack-quantized, W4A16 or W4A8 FP8) in checkpoints.lint_wna16, W8A8
INT8 in checkpoints.lint_int8.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import struct
from collections.abc import Callable
from pathlib import Path

from quantmatrix.adapter.declared import MIXED
from quantmatrix.adapter.roles import leaf as role_leaf
from quantmatrix.bounded import shown
from quantmatrix.checkpoints import experts, lint_int8, lint_mixed, lint_mxfp4, lint_mxfp8, lint_wna16, producers
from quantmatrix.checkpoints.experts import EXPERT_FINDINGS, MAX_EXPERTS
from quantmatrix.checkpoints.lint_config import Declared, Finding, declared, ignored
from quantmatrix.checkpoints.untrusted import INDEX, LintError, json_object, read_header, read_index

__all__ = ["EXPERT_FINDINGS", "MAX_EXPERTS", "SCHEME", "Declared", "Finding", "LintError", "LintReport", "declared",
           "ignored", "lint"]
SCHEME = "nvfp4"  # the scheme module of NVFP4 tensors (dequant_logits decodes those): each producer's names for it
# Per scheme module (a Declared's family: producers.leaves names its tensors), the format's word, and the dtype a
# quantized weight named `weight` is stored in (WNA16 producers name theirs apart: qweight, weight_packed).
FORMAT_WORDS = {"nvfp4": "NVFP4", "fp8": "FP8", "fp8_block": "FP8", lint_wna16.WNA16: "integer weight-only",
                MIXED: "quantized (MIXED_PRECISION)", lint_int8.INT8: "W8A8 INT8", "w4a8": "W4A8 FP8",
                lint_mxfp4.MXFP4: "MXFP4", lint_mxfp8.MXFP8: "MXFP8"}
_WEIGHT_DTYPES = {"nvfp4": "U8", "fp8": "F8_E4M3", "fp8_block": "F8_E4M3", lint_int8.INT8: "I8",
                  lint_mxfp8.MXFP8: "F8_E4M3"}
_ALLOWED_EXTRA = {"bias", "k_scale", "v_scale"}  # kv-cache scales ride on k_proj / v_proj
_EMBEDDINGS = ("embed_tokens", "wte", "word_embeddings", "embed_in", "tok_embeddings", "embeddings")
_WIDTH = {"F32": 4, "BF16": 2, "F8_E4M3": 1}  # bytes per element of the dtypes whose values the lint reads
_FP8_SCALE_DTYPES = ("F32", "BF16")  # what producers store FP8 weight and input scales in
_FP8_BLOCK = 128
MAX_MATCHES = 5_000_000  # modules x ignore entries the lint matches before it refuses the work


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One tensor as its file's header describes it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    offset: int  # absolute byte offset of the data in `file`

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass
class LintReport:
    path: Path
    declared: Declared
    tensors: int
    files: int
    nvfp4_modules: int  # the quantized modules of the declared format (NVFP4 or FP8)
    findings: list[Finding]

    def codes(self) -> set[str]:
        return {f.code for f in self.findings}

    def render(self) -> str:
        d = self.declared
        lines = [f"quantmatrix lint {shown(self.path)}",
                 f"declared: {d.producer} {d.scheme} ({shown(d.why)}); "
                 f"ignore: {shown(', '.join(d.ignore), 2000) or '-'}",
                 f"read: {self.files} safetensors file(s), {self.tensors} tensors, {self.nvfp4_modules} "
                 f"{FORMAT_WORDS[d.family]} modules (headers, per-tensor scales and group indices only)"]
        if not self.findings:
            return "\n".join([*lines, "OK: every tensor agrees with the declared scheme"])
        counts: dict[str, int] = {}
        for f in self.findings:
            counts[f.code] = counts.get(f.code, 0) + 1
        summary = ", ".join(f"{c} {n}" for c, n in sorted(counts.items()))
        return "\n".join([*lines, f"FAIL: {len(self.findings)} finding(s) ({summary})",
                          *(f"  {shown(f)}" for f in self.findings)])


# ------------------------------------------------------------------------------------------ reading


def read_headers(path: Path) -> tuple[dict[str, Tensor], list[Finding], int]:
    """Every tensor vLLM would load, from the headers alone: with a shard index, the shards it names (a shard it
    names that is missing, a tensor it maps to a shard that lacks it, and a file it leaves out, whose tensors vLLM
    never loads, are findings); without one, every top-level *.safetensors file."""
    files = sorted(path.glob("*.safetensors"))
    weight_map = read_index(path)
    findings = []
    if weight_map is not None:
        files, findings = _indexed(path, files, weight_map)
    tensors: dict[str, Tensor] = {}
    for file in files:
        for name, dtype, shape, offset in read_header(file, path):
            t = Tensor(name, dtype, shape, file, offset)
            if name in tensors:
                findings.append(Finding("inconsistent", name.rpartition(".")[0], name.rpartition(".")[2],
                                        f"stored twice ({tensors[name].file.name} and {file.name})"))
            tensors[name] = t
    for name, shard in (weight_map or {}).items():
        if name not in tensors and (path / shard).is_file():
            findings.append(Finding("missing_tensor", name.rpartition(".")[0], name.rpartition(".")[2],
                                    f"{INDEX} maps it to {shard}, which does not hold it"))
    return tensors, findings, len(files)


def _indexed(path: Path, files: list[Path], weight_map: dict[str, str]) -> tuple[list[Path], list[Finding]]:
    """The shards the index names (as vLLM filters them), and a finding per missing or unlisted shard."""
    named = {path / shard for shard in weight_map.values()}
    findings = []
    for shard in sorted(named):
        if not shard.exists():
            n = sum(path / s == shard for s in weight_map.values())
            findings.append(Finding("missing_tensor", INDEX, "", f"names shard {shard.name} for {n} tensor(s), and "
                                    "the directory has no such file (vLLM refuses to load)"))
    for file in files:
        if file not in named:
            findings.append(Finding("unexpected_tensor", INDEX, "", f"leaves out {file.name}: vLLM loads only the "
                                    "shards the index names, so its tensors are never loaded"))
    return [f for f in files if f in named] + sorted(f for f in named if f.exists() and f not in files), findings


def _read(t: Tensor, count: int) -> bytes:
    with t.file.open("rb") as fh:
        fh.seek(t.offset)
        return fh.read(count * _WIDTH[t.dtype])


def scalar(t: Tensor) -> float:
    """The value of a one-element F32 (or BF16: the high half of an F32) tensor."""
    raw = _read(t, 1)
    return struct.unpack("<f", raw if t.dtype == "F32" else b"\x00\x00" + raw)[0]


# ------------------------------------------------------------------------------------------- checks


def _scheme_words(d: Declared) -> str:
    return {"w4a4": "W4A4", "weight_only": "weight-only", "fp8_static": "static-activation FP8",
            "fp8_dynamic": "dynamic-activation FP8", "fp8_block": "block-wise FP8", "w8a8_int8": "W8A8 INT8",
            "w4a8_fp8": "W4A8 FP8", "mxfp4": "MXFP4", "mxfp8": "MXFP8"}[d.scheme] + f" ({d.why})"


def _fp8_scale_shape(w: Tensor, block: bool) -> tuple[tuple[int, ...], ...]:
    """The weight-scale shapes vLLM accepts for an FP8 weight: one element or one per output row, or the
    128x128 block grid."""
    o, i = w.shape
    if block:
        return ((-(-o // _FP8_BLOCK), -(-i // _FP8_BLOCK)),)
    return ((), (1,), (o, 1), (o,))


def _check_scale(t: Tensor, leaf: str, bad: Callable[[str, str, str], None], values: bool) -> None:
    """An FP8 weight or input scale's dtype, and (per tensor, or every element with `values`) finite and > 0."""
    if t.dtype not in _FP8_SCALE_DTYPES:
        bad("bad_dtype", leaf, f"is {t.dtype}; FP8 scales are {' or '.join(_FP8_SCALE_DTYPES)} (vLLM copies them "
            "into float32 without a word, rounding whatever this dtype held)")
        return
    if t.numel == 1:
        v = scalar(t)
        if not math.isfinite(v) or v <= 0:
            bad("bad_value", leaf, f"is {v!r}; a scale must be finite and > 0")
    elif values and t.dtype == "F32":
        got = struct.unpack(f"<{t.numel}f", _read(t, t.numel))
        n = sum(not math.isfinite(v) or v <= 0 for v in got)
        if n:
            bad("bad_value", leaf, f"{n} of {t.numel} scales are not finite and > 0")


def _check_fp8(module: str, leaves: dict[str, Tensor], d: Declared, block_scales: bool) -> list[Finding]:
    """One FP8 module: an F8_E4M3 weight, its scale in the declared granularity, and an input_scale exactly when
    the config declares static activations."""
    module_of = d.family
    names = producers.leaves(d.producer, module_of)
    weight, scale, inputs = names["weight"], names["block_scale"], names["input_scale"]
    out: list[Finding] = []

    def bad(code: str, leaf: str, message: str) -> None:
        out.append(Finding(code, module, leaf, message))

    static = d.scheme == "fp8_static"
    required = [weight, scale, *([inputs] if static else [])]
    for leaf in required:
        if leaf not in leaves:
            why = ("; vLLM's static FP8 MoE kernels read one per expert (ModelOpt's loader leaves 1.0 where none "
                   "was loaded; the max over the experts scales them all)") if leaf == inputs else ""
            bad("missing_tensor", leaf, f"missing; the config declares {_scheme_words(d)}{why}")
    if not static and inputs in leaves:
        bad("unexpected_tensor", inputs, f"present, but the config declares {_scheme_words(d)}: vLLM quantizes the "
            "activations itself and never reads it, so the export and its config disagree about the activations")
    for leaf in sorted(set(leaves) - set(required) - {inputs} - _ALLOWED_EXTRA):
        bad("unexpected_tensor", leaf, f"not part of a {d.producer} {FORMAT_WORDS[module_of]} module")
    w, s = leaves.get(weight), leaves.get(scale)
    if w is not None and (w.dtype != "F8_E4M3" or len(w.shape) != 2):
        bad("bad_dtype" if w.dtype != "F8_E4M3" else "bad_shape", weight, f"is {w.dtype} {list(w.shape)}; FP8 "
            "weights are F8_E4M3 [out, in]")
        w = None
    if s is not None:
        shapes = _fp8_scale_shape(w, module_of == "fp8_block") if w is not None else ()
        if shapes and s.shape not in shapes:
            bad("bad_shape", scale, f"is {list(s.shape)}, expected {' or '.join(str(list(x)) for x in shapes)} "
                f"for {weight} {list(w.shape)}" + (" (one per 128x128 block)" if module_of == "fp8_block" else ""))
        else:
            _check_scale(s, scale, bad, block_scales)
    if inputs in leaves and static:
        t = leaves[inputs]
        if t.numel != 1:
            bad("bad_shape", inputs, f"is {list(t.shape)}; a per-tensor input scale has one element")
        else:
            _check_scale(t, inputs, bad, False)
    return out


def _check_module(module: str, leaves: dict[str, Tensor], d: Declared, block_scales: bool) -> list[Finding]:
    names = producers.leaves(d.producer, SCHEME)
    scale, scale_2, inputs = names["block_scale"], names["global_scale"], names["input_scale"]
    out: list[Finding] = []

    def bad(code: str, leaf: str, message: str) -> None:
        out.append(Finding(code, module, leaf, message))

    required = [names["weight"], scale, scale_2]
    if d.scheme == "w4a4":
        required.append(inputs)
    for leaf in required:
        if leaf not in leaves:
            why = ""
            if leaf == inputs:
                why = ("; vLLM's W4A4 MoE kernels fold it into the dequant alphas, so the buffer it never "
                       "loaded (uninitialised memory) would scale this expert")
            bad("missing_tensor", leaf, f"missing; the config declares {_scheme_words(d)}{why}")
    if d.scheme == "weight_only" and inputs in leaves:
        bad("unexpected_tensor", inputs, f"present, but the config declares {_scheme_words(d)}: vLLM's "
            "weight-only path discards it, so the export and its config disagree about the activations")
    other = {v for p, n in producers.writers(SCHEME).items() if p != d.producer for v in n.values()} - set(
        names.values())
    for leaf in sorted(set(leaves) - set(required) - {inputs} - _ALLOWED_EXTRA):
        hint = " (a name of the other producer)" if leaf in other else ""
        bad("unexpected_tensor", leaf, f"not part of a {d.producer} NVFP4 module{hint}")

    w, s = leaves.get(names["weight"]), leaves.get(scale)
    if w is not None and (w.dtype != "U8" or len(w.shape) != 2):
        bad("bad_dtype" if w.dtype != "U8" else "bad_shape", w.name.rpartition(".")[2],
            f"is {w.dtype} {list(w.shape)}; packed e2m1 is U8 [out, in/2]")
    elif w is not None and w.shape[1] * 2 % 16:
        bad("bad_shape", w.name.rpartition(".")[2], f"is {list(w.shape)}: {w.shape[1] * 2} inputs, not whole "
            "blocks of 16 (one E4M3 scale per 16 inputs)")
    if s is not None:
        if s.dtype != "F8_E4M3":
            bad("bad_dtype", scale, f"is {s.dtype}; block scales are F8_E4M3")
        if w is not None and len(w.shape) == 2 and s.shape != (w.shape[0], w.shape[1] * 2 // 16):
            bad("bad_shape", scale, f"is {list(s.shape)}, expected {[w.shape[0], w.shape[1] * 2 // 16]} "
                f"(one per 16 inputs of {names['weight']} {list(w.shape)})")
        elif block_scales and s.dtype == "F8_E4M3":
            raw = _read(s, s.numel)
            nan = sum(raw.count(b) for b in (b"\x7f", b"\xff"))
            zero = sum(raw.count(b) for b in (b"\x00", b"\x80"))
            if nan or zero:
                bad("bad_value", scale, f"{nan} NaN and {zero} zero of {s.numel} block scales")
    for leaf in (scale_2, inputs):
        t = leaves.get(leaf)
        if t is None:
            continue
        if t.dtype != "F32":
            bad("bad_dtype", leaf, f"is {t.dtype}; per-tensor scales are F32")
        elif t.numel != 1:
            bad("bad_shape", leaf, f"is {list(t.shape)}; a per-tensor scale has one element")
        else:
            v = scalar(t)
            if not math.isfinite(v) or v <= 0:
                bad("bad_value", leaf, f"is {v!r}; a scale must be finite and > 0")
    return out


def _check_fused(modules: dict[str, dict[str, Tensor]], d: Declared) -> list[Finding]:
    """An expert's gate and up projections share one input and one global scale (vLLM keeps one per w13)."""
    pairs = (("gate_proj", "up_proj"), ("w1", "w3"))
    leaf = producers.leaves(d.producer, SCHEME)["global_scale"]
    out = []
    for module, leaves in modules.items():
        for a, b in pairs:
            if not module.endswith(f".{a}") or ".experts." not in module:
                continue
            other = modules.get(module[: -len(a)] + b, {})
            ta, tb = leaves.get(leaf), other.get(leaf)
            if ta and tb and ta.numel == tb.numel == 1 and ta.dtype == tb.dtype == "F32":
                va, vb = scalar(ta), scalar(tb)
                if va != vb and math.isfinite(va) and math.isfinite(vb):
                    out.append(Finding("inconsistent", module, leaf, f"{va!r} but {b} has {vb!r}; vLLM uses one "
                                       f"value for the fused {a}/{b} weight (warns, takes one of them)"))
    return out


def _check_wna16(module: str, leaves: dict[str, Tensor], d: Declared, block_scales: bool) -> list[Finding]:
    """One integer-weight module (WNA16, or W4A8's same weights) against the declared bits, groups, order and zero
    points."""
    if d.weights is None:
        raise LintError(f"{module}: an integer weight-only declaration without its weights (lint_config.declared)")
    return [Finding(*f) for f in lint_wna16.check_module(module, leaves, d.producer, d.weights, block_scales,
                                                         d.family)]


def _check_int8(module: str, leaves: dict[str, Tensor], d: Declared, block_scales: bool) -> list[Finding]:
    return [Finding(*f) for f in lint_int8.check_int8_module(module, leaves, d.producer, block_scales)]


def _check_mxfp4(module: str, leaves: dict[str, Tensor], d: Declared, block_scales: bool,
                 config: dict) -> list[Finding]:
    return [Finding(*f) for f in lint_mxfp4.check_mxfp4_module(module, leaves, d.producer, config, block_scales)]


def _check_mxfp8(module: str, leaves: dict[str, Tensor], d: Declared, block_scales: bool) -> list[Finding]:
    return [Finding(*f) for f in lint_mxfp8.check_mxfp8_module(module, leaves, d.producer, block_scales)]


# scheme module (a Declared's family) -> the check of one of its quantized modules
_CHECKS = {"nvfp4": _check_module, "fp8": _check_fp8, "fp8_block": _check_fp8, lint_wna16.WNA16: _check_wna16,
           "w4a8": _check_wna16, lint_int8.INT8: _check_int8, lint_mxfp8.MXFP8: _check_mxfp8}
# Families whose vLLM config quantizes no Linear at all (Mxfp4Config: only the MoE experts), so a bf16 Linear
# outside the ignore list is what vLLM runs too, not a finding.
_EXPERTS_ONLY = (lint_mxfp4.MXFP4,)


def lint(path: Path, block_scales: bool = False) -> LintReport:
    """Lint one checkpoint directory."""
    path = Path(path)
    d, findings = declared(path)
    tensors, dupes, nfiles = read_headers(path)
    if not tensors:
        raise LintError(f"{path}: no *.safetensors files with tensors")
    findings += dupes
    config = json_object(path / "config.json", "config.json")
    modules: dict[str, dict[str, Tensor]] = {}
    for t in tensors.values():
        module, _, leaf = t.name.rpartition(".")
        modules.setdefault(module, {})[leaf] = t
    if len(modules) * len(d.ignore) > MAX_MATCHES:
        raise LintError(f"{path}: {len(modules)} modules x {len(d.ignore)} ignore entries is over the "
                        f"{MAX_MATCHES} matches this lint makes")
    if d.family == MIXED:
        mixed, count = lint_mixed.check_mixed(modules, d, _CHECKS, block_scales)
        findings += [*mixed, *(Finding(*f) for f in experts.check(modules, config, path / "config.json")),
                     *_check_fused(modules, d)]
        return LintReport(path, d, len(tensors), nfiles, count, findings)
    count = 0
    module_of = d.family
    words = FORMAT_WORDS[module_of]
    quantized = producers.quantized_leaves(module_of)
    check = _CHECKS.get(module_of) or functools.partial(_check_mxfp4, config=config)
    for module, leaves in modules.items():
        weight = leaves.get("weight")
        is_quantized = bool(quantized & {role_leaf(lf) for lf in leaves}) or (
            weight is not None and weight.dtype == _WEIGHT_DTYPES.get(module_of))
        count += is_quantized
        if d.scheme == "unquantized":
            if is_quantized:
                findings.append(Finding("unexpected_tensor", module, "", f"holds {words} tensors "
                                        f"({', '.join(sorted(leaves))}) but the config declares no quantization"))
        elif ignored(module, d.ignore):
            if is_quantized:
                findings.append(Finding("quantized_but_ignored", module, "", "matches the config's ignore list "
                                        f"but holds {words} tensors ({', '.join(sorted(leaves))})"))
        elif is_quantized:
            findings += check(module, leaves, d, block_scales)
        else:
            w = leaves.get("weight")
            if w is not None and len(w.shape) == 2 and not module.endswith(_EMBEDDINGS) and (
                    module_of not in _EXPERTS_ONLY):
                findings.append(Finding("unquantized", module, "weight", f"is {w.dtype} {list(w.shape)} with no "
                                        "scales, but the config quantizes every Linear it does not ignore"))
    findings += [Finding(*f) for f in experts.check(modules, config, path / "config.json")]
    if module_of == SCHEME and d.scheme != "unquantized":
        findings += _check_fused(modules, d)
    return LintReport(path, d, len(tensors), nfiles, count, findings)
