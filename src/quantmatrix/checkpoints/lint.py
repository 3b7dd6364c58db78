"""Checkpoint lint: the scheme a checkpoint's config declares against the tensors its files hold, per module
and per expert.

It reads safetensors headers (and the few bytes of per-tensor scales), never the weights, so it runs on a
real 30B export in a second. The declaration is read the way vLLM reads it (weight-only when ModelOpt's
quant_algo is W4A16_NVFP4 or every config group's input_activations is None; compressed-tensors: a falsy
input_activations), so a finding is exactly a place where vLLM's kernel choice and the files disagree. Integer
weight-only exports (GPTQ, AWQ, compressed-tensors pack-quantized): module by module in checkpoints.lint_wna16.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import math
import re
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quantmatrix.adapter.declared import CT_NVFP4_FORMAT, CT_WNA16_FORMAT, Declaration, IntWeights, declare
from quantmatrix.bounded import shown
from quantmatrix.checkpoints import experts, lint_wna16, producers
from quantmatrix.checkpoints.experts import EXPERT_FINDINGS, MAX_EXPERTS
from quantmatrix.checkpoints.untrusted import (
    INDEX,
    LintError,
    ignore_list,
    json_object,
    read_header,
    read_index,
    safe_regex,
)

__all__ = ["EXPERT_FINDINGS", "MAX_EXPERTS", "SCHEME", "LintError", "LintReport", "declared", "lint"]
SCHEME = "nvfp4"  # the scheme module whose tensors this lint knows: each producer's names for it (producers.leaves)
FAMILIES = (SCHEME, lint_wna16.WNA16)  # every scheme module whose tensors mark a module as quantized
_ALLOWED_EXTRA = {"bias", "k_scale", "v_scale"}  # kv-cache scales ride on k_proj / v_proj
_EMBEDDINGS = ("embed_tokens", "wte", "word_embeddings", "embed_in", "tok_embeddings", "embeddings")
_EXPERT = re.compile(r"\.layers\.([0-9]+)\..*\.experts\.(0|[1-9][0-9]*)\.")
_WIDTH = {"F32": 4, "F8_E4M3": 1}  # bytes per element of the dtypes whose values the lint reads
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


@dataclasses.dataclass(frozen=True)
class Finding:
    code: str
    module: str
    tensor: str  # the tensor's last name component, "" for the config
    message: str

    @property
    def name(self) -> str:
        """The full tensor name (the module's, for a finding about the module as a whole)."""
        return f"{self.module}.{self.tensor}" if self.tensor else self.module

    @property
    def layer_expert(self) -> tuple[int, int] | None:
        m = _EXPERT.search(self.module + ".")
        return (int(m.group(1)), int(m.group(2))) if m else None

    def __str__(self) -> str:
        le = self.layer_expert
        where = f" [layer {le[0]}, expert {le[1]}]" if le else ""
        return f"{self.module}{where} {self.tensor or '(config)'}: {self.message}"


@dataclasses.dataclass(frozen=True)
class Declared:
    """What the config says, in vLLM's reading."""

    producer: str  # modelopt | compressed-tensors | none
    scheme: str  # weight_only | w4a4 | unquantized
    why: str
    ignore: tuple[str, ...]
    weights: IntWeights | None = None  # integer weight-only (checkpoints.lint_wna16); None: NVFP4 or unquantized

    @property
    def family(self) -> str:
        return "NVFP4" if self.weights is None else "integer weight-only"


@dataclasses.dataclass
class LintReport:
    path: Path
    declared: Declared
    tensors: int
    files: int
    nvfp4_modules: int
    findings: list[Finding]

    def codes(self) -> set[str]:
        return {f.code for f in self.findings}

    def render(self) -> str:
        d = self.declared
        lines = [f"quantmatrix lint {shown(self.path)}",
                 f"declared: {d.producer} {d.scheme} ({shown(d.why)}); "
                 f"ignore: {shown(', '.join(d.ignore), 2000) or '-'}",
                 f"read: {self.files} safetensors file(s), {self.tensors} tensors, {self.nvfp4_modules} {d.family} "
                 "modules (headers, per-tensor scales and group indices only)"]
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
    """The value of a one-element F32 tensor."""
    return struct.unpack("<f", _read(t, 1))[0]


# -------------------------------------------------------------------------------------- declaration


def _ignore(value: Any, where: Path) -> tuple[str, ...]:
    """The config's ignore list: strings only, bounded, and every `re:` pattern one RE2 compiles."""
    return ignore_list(value, where)[0]


def _legacy(path: Path) -> tuple[Declared, list[Finding]]:
    """hf_quant_config.json, read when config.json has no quantization_config (ModelOpt before 0.31)."""
    legacy = path / "hf_quant_config.json"
    qc = json_object(legacy, "hf_quant_config.json")
    inner = qc.get("quantization", {})
    if not isinstance(inner, dict):
        raise LintError(f"{legacy}: quantization is {type(inner).__name__}, not an object")
    d = declare(qc, legacy=True)
    if d.groups_shape.startswith("a "):
        raise LintError(f"{legacy}: config_groups is {d.groups_shape}, not a mapping of group name -> group")
    if d.scheme is None:
        raise LintError(f"{legacy}: quant_algo {d.algo!r} is not NVFP4; this lint knows NVFP4 only")
    shape = "no config_groups" if d.groups_shape == "missing" else d.groups_text()
    return Declared("modelopt", d.scheme, f"hf_quant_config.json quant_algo {d.algo}, {shape}",
                    _ignore(inner.get("exclude_modules"), legacy)), _disagreement(d)


def _disagreement(d: Declaration) -> list[Finding]:
    """Config groups that differ on the question the producer's rule asks, as vLLM then runs them."""
    if not d.disagree:
        return []
    if d.producer == "modelopt" and d.algo == "NVFP4":
        why = "vLLM promotes to weight-only only when every group says None, so it runs all of them W4A4"
    elif d.producer == "compressed-tensors":
        why = "this lint checks every module against W4A4"
    else:
        return []
    return [Finding("config", "config.json", "", f"config_groups disagree ({d.groups_text()}); {why}")]


def declared(path: Path) -> tuple[Declared, list[Finding]]:
    """The config's scheme, read as vLLM reads it (adapter.declared), plus config-level findings."""
    cfg = json_object(path / "config.json", "config.json")
    qc = cfg.get("quantization_config")
    if qc is not None and not isinstance(qc, dict):
        raise LintError(f"{path}/config.json: quantization_config is {type(qc).__name__}, not an object")
    if qc is None and (path / "hf_quant_config.json").is_file():
        return _legacy(path)
    if qc is None:
        return Declared("none", "unquantized", "config.json has no quantization_config", ()), []
    d = declare(qc)
    where = path / "config.json"
    if d.groups_shape.startswith("a "):
        raise LintError(f"{where}: quantization_config.config_groups is {d.groups_shape}, not a mapping of group "
                        "name -> group")
    if d.producer == "modelopt":
        if d.scheme is None:
            raise LintError(f"{where}: quant_algo {d.algo!r} is not NVFP4; this lint knows NVFP4 only")
        return Declared("modelopt", d.scheme, f"config.json quant_algo {d.algo}, {d.groups_text()}",
                        _ignore(qc.get("ignore") or qc.get("exclude_modules"), where)), _disagreement(d)
    if d.producer == "compressed-tensors":
        if d.scheme is None:
            raise LintError(f"{where}: compressed-tensors format {qc.get('format')!r} is not "
                            f"{CT_NVFP4_FORMAT} or {CT_WNA16_FORMAT} with int weights")
        return Declared("compressed-tensors", d.scheme, f"config.json format {d.format}, {d.groups_text()}",
                        _ignore(qc.get("ignore"), where), d.weights), _disagreement(d)
    if d.weights is not None:
        return Declared(d.producer, d.scheme or "weight_only", f"config.json {lint_wna16.words(d.producer, d.weights)}",
                        _ignore(lint_wna16.ignore_patterns(qc), where), d.weights), []
    raise LintError(f"{where}: quant_method {qc.get('quant_method')!r} is none of modelopt, compressed-tensors, "
                    "gptq, awq")


def ignored(module: str, patterns: Iterable[str]) -> bool:
    """ModelOpt globs, compressed-tensors `re:` regexes, or plain names (also matching as a prefix)."""
    for p in patterns:
        if p.startswith("re:"):
            if _compiled(p[3:]).match(module):
                return True
        elif fnmatch.fnmatchcase(module, p) or module == p or module.startswith(p + "."):
            return True
    return False


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    return safe_regex(pattern, "ignore list")


# ------------------------------------------------------------------------------------------- checks


def _scheme_words(d: Declared) -> str:
    return {"w4a4": "W4A4", "weight_only": "weight-only"}[d.scheme] + f" ({d.why})"


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
    nvfp4 = 0
    quantized = frozenset().union(*(producers.quantized_leaves(f) for f in FAMILIES))
    for module, leaves in modules.items():
        weight = leaves.get("weight")
        is_nvfp4 = bool(quantized & set(leaves)) or (weight is not None and weight.dtype == "U8")
        nvfp4 += is_nvfp4
        if d.scheme == "unquantized":
            if is_nvfp4:
                findings.append(Finding("unexpected_tensor", module, "", f"holds {d.family} tensors "
                                        f"({', '.join(sorted(leaves))}) but the config declares no quantization"))
        elif ignored(module, d.ignore):
            if is_nvfp4:
                findings.append(Finding("quantized_but_ignored", module, "", "matches the config's ignore list "
                                        f"but holds {d.family} tensors ({', '.join(sorted(leaves))})"))
        elif is_nvfp4 and d.weights is not None:  # integer weight-only
            findings += [Finding(*f) for f in lint_wna16.check_module(module, leaves, d.producer, d.weights,
                                                                      block_scales)]
        elif is_nvfp4:
            findings += _check_module(module, leaves, d, block_scales)
        else:
            w = leaves.get("weight")
            if w is not None and len(w.shape) == 2 and not module.endswith(_EMBEDDINGS):
                findings.append(Finding("unquantized", module, "weight", f"is {w.dtype} {list(w.shape)} with no "
                                        "scales, but the config quantizes every Linear it does not ignore"))
    findings += [Finding(*f) for f in experts.check(modules, config, path / "config.json")]
    if d.scheme != "unquantized" and d.weights is None:
        findings += _check_fused(modules, d)
    return LintReport(path, d, len(tensors), nfiles, nvfp4, findings)
