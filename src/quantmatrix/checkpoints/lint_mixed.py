"""Lint of a ModelOpt MIXED_PRECISION checkpoint (checkpoints.lint): every module against the algo its config's
`quantized_layers` gives it, by the check of that algo's scheme module (NVFP4 or FP8).

vLLM 0.32 resolves each layer's algo from that map alone (ModelOptMixedPrecisionConfig._resolve_quant_algo): a
module it does not list is built unquantized, whatever the files hold. So quantized tensors of an unlisted module
are the hazard here: vLLM loads the packed or FP8 weight into a bf16 layer and drops its scales without a word.
A bf16 module the map does not list is what MIXED_PRECISION means (no finding), listed or not in `ignore`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from quantmatrix.adapter.declared import MODELOPT_ALGOS, MODELOPT_FAMILIES
from quantmatrix.checkpoints import producers
from quantmatrix.checkpoints.lint_config import Declared, Finding, ignored

# the scheme modules a MIXED_PRECISION module can be in (their weight dtype tells a quantized module apart)
_MIXED_WEIGHT_DTYPES = {"nvfp4": "U8", "fp8": "F8_E4M3", "fp8_block": "F8_E4M3"}
Check = Callable[[str, dict[str, Any], Declared, bool], list[Finding]]


def _family(algo: str) -> str:
    return MODELOPT_FAMILIES.get(MODELOPT_ALGOS[algo], "nvfp4")


def _quantized(leaves: Mapping[str, Any]) -> bool:
    """Whether a module holds the tensors of any scheme module a MIXED_PRECISION module can be in (a quantized
    leaf, or a weight in its dtype)."""
    weight = leaves.get("weight")
    return any(producers.quantized_leaves(family) & set(leaves) or (weight is not None and weight.dtype == dtype)
               for family, dtype in _MIXED_WEIGHT_DTYPES.items())


def check_mixed(modules: Mapping[str, dict[str, Any]], d: Declared, checks: Mapping[str, Check],
          block_scales: bool) -> tuple[list[Finding], int]:
    """Findings of every module against the map, and how many modules hold quantized tensors. `checks`: the lint's
    check of one module per scheme module (checkpoints.lint._CHECKS)."""
    layers = dict(d.layers)
    findings: list[Finding] = []
    count = 0
    for module, leaves in modules.items():
        held = _quantized(leaves)
        count += held
        algo = layers.get(module)
        if algo is not None:
            if not held:
                w = leaves.get("weight")
                findings.append(Finding("unquantized", module, "weight", f"is {getattr(w, 'dtype', '?')} with no "
                                        f"scales, but quantized_layers declares it {algo}"))
                continue
            family = _family(algo)
            sub = dataclasses.replace(d, scheme=MODELOPT_ALGOS[algo], family=family, layers=())
            findings += checks[family](module, leaves, sub, block_scales)
        elif held and ignored(module, d.ignore):
            findings.append(Finding("quantized_but_ignored", module, "", "matches the config's ignore list but holds "
                                    f"quantized tensors ({', '.join(sorted(leaves))})"))
        elif held:
            findings += [Finding("unexpected_tensor", module, leaf, "quantized, but quantized_layers does not list "
                                 f"{module}: vLLM builds it unquantized (bf16) and "
                                 + ("loads the quantized bytes as its weights" if leaf == "weight" else
                                    "drops this tensor")) for leaf in sorted(leaves)]
    return findings, count
