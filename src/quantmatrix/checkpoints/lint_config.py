"""What a checkpoint's config declares, for the lint (checkpoints.lint): the scheme in vLLM's reading
(adapter.declared), the scheme module (family) whose tensors it holds, its ignore list, config-level findings, and
the Finding every lint check returns."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quantmatrix.adapter.declared import (
    CT_FP8_FORMAT,
    CT_NVFP4_FORMAT,
    CT_WNA16_FORMAT,
    MIXED,
    MIXED_ALGO,
    MODELOPT_ALGOS,
    Declaration,
    IntWeights,
    declare,
)
from quantmatrix.checkpoints import lint_wna16
from quantmatrix.checkpoints.untrusted import LintError, ignore_list, json_object, safe_regex

_EXPERT = re.compile(r"\.layers\.([0-9]+)\..*\.experts\.(0|[1-9][0-9]*)\.")


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

    producer: str  # modelopt | compressed-tensors | fp8 | gptq | awq | none
    scheme: str  # a schema.vocab.RESOLUTIONS word but rejected: weight_only | w4a4 | fp8_static | ... | unquantized
    why: str
    ignore: tuple[str, ...]
    weights: IntWeights | None = None  # integer weight-only (checkpoints.lint_wna16): bits, groups, order, zeros
    family: str = "nvfp4"  # the scheme module whose tensors it holds (adapter.declared): nvfp4 | fp8 | ... | wna16
    # | mixed (each module its own algo's)
    layers: tuple[tuple[str, str], ...] = ()  # MIXED_PRECISION: (module, quant_algo) of quantized_layers


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
    if d.family == MIXED:
        return _mixed(d, inner.get("exclude_modules"), legacy, "hf_quant_config.json"), []
    if d.groups_shape.startswith("a "):
        raise LintError(f"{legacy}: config_groups is {d.groups_shape}, not a mapping of group name -> group")
    if d.scheme is None:
        raise LintError(f"{legacy}: quant_algo {d.algo!r} is not one this lint knows ({', '.join(MODELOPT_ALGOS)})")
    shape = "no config_groups" if d.groups_shape == "missing" else d.groups_text()
    return Declared("modelopt", d.scheme, f"hf_quant_config.json quant_algo {d.algo}, {shape}",
                    _ignore(inner.get("exclude_modules"), legacy), family=d.family), _disagreement(d)


def _mixed(d: Declaration, ignore: Any, where: Path, file: str) -> Declared:
    """MIXED_PRECISION: the experts' scheme, and the per-module map every module is linted against."""
    if not d.layers:
        raise LintError(f"{where}: quant_algo {MIXED_ALGO} without a quantized_layers mapping (vLLM refuses it)")
    unknown = sorted({a for _, a in d.layers if a not in MODELOPT_ALGOS})
    if unknown or d.scheme is None:
        raise LintError(f"{where}: quantized_layers uses {unknown or 'several expert algos'}; this lint knows one "
                        f"expert algo of {', '.join(MODELOPT_ALGOS)}")
    algos = sorted({a for _, a in d.layers})
    return Declared("modelopt", d.scheme, f"{file} quant_algo {MIXED_ALGO}, quantized_layers {len(d.layers)} "
                    f"module(s) of {', '.join(algos)}", _ignore(ignore, where), family=MIXED, layers=d.layers)


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
    if d.family == MIXED:
        return _mixed(d, qc.get("ignore") or qc.get("exclude_modules"), where, "config.json"), []
    if d.producer == "modelopt":
        if d.scheme is None:
            raise LintError(f"{where}: quant_algo {d.algo!r} is not one this lint knows ({', '.join(MODELOPT_ALGOS)})")
        return Declared("modelopt", d.scheme, f"config.json quant_algo {d.algo}, {d.groups_text()}",
                        _ignore(qc.get("ignore") or qc.get("exclude_modules"), where),
                        family=d.family), _disagreement(d)
    if d.producer == "compressed-tensors":
        if d.scheme is None:
            raise LintError(f"{where}: compressed-tensors format {qc.get('format')!r} is not "
                            f"{CT_NVFP4_FORMAT}, {CT_FP8_FORMAT} or {CT_WNA16_FORMAT} with int weights")
        return Declared("compressed-tensors", d.scheme, f"config.json format {d.format}, {d.groups_text()}",
                        _ignore(qc.get("ignore"), where), d.weights, d.family), _disagreement(d)
    if d.producer == "fp8":
        if d.scheme is None:
            raise LintError(f"{where}: fp8 activation_scheme {qc.get('activation_scheme')!r} is neither static nor "
                            "dynamic")
        return Declared("fp8", d.scheme, f"config.json quant_method fp8, activation_scheme "
                        f"{qc.get('activation_scheme')}, weight_block_size {qc.get('weight_block_size')}",
                        _ignore(qc.get("ignored_layers") or qc.get("modules_to_not_convert"), where),
                        family=d.family), []
    if d.weights is not None:
        return Declared(d.producer, d.scheme or "weight_only", f"config.json {lint_wna16.words(d.producer, d.weights)}",
                        _ignore(lint_wna16.ignore_patterns(qc), where), d.weights, d.family), []
    if d.family == "mxfp4":
        return Declared(d.producer, "mxfp4", "config.json quant_method mxfp4 (MXFP4 experts; vLLM's Mxfp4Config "
                        "reads no other key)", _ignore(qc.get("modules_to_not_convert"), where), family=d.family), []
    raise LintError(f"{where}: quant_method {qc.get('quant_method')!r} is none of modelopt, compressed-tensors, fp8, "
                    "gptq, awq, mxfp4")


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


