"""vLLM's parameter names (both producers; MoE experts and linear layers) -> the role a kernel reads them in
(schema.vocab.ROLES); anything else (biases, router weights) is "other"."""

from __future__ import annotations

import re

_ROLES = (
    (re.compile(r"(w(13|2)_)?weight(_packed)?$"), "weight"),
    (re.compile(r"(w(13|2)_)?weight_scale$"), "block_scale"),
    (re.compile(r"(w(13|2)_)?(weight_scale_2|weight_global_scale)$"), "global_scale"),
    (re.compile(r"(w(13|2)_)?(input_scale|input_global_scale)$"), "input_scale"),
)


def role_of(param_name: str) -> str:
    leaf = param_name.rsplit(".", 1)[-1]
    return next((role for pattern, role in _ROLES if pattern.fullmatch(leaf)), "other")


# vLLM's fused expert parameters (…experts[.routed_experts].w13_<leaf> / w2_<leaf>) -> the checkpoint projections
# each expert row is loaded from, in both namings (Qwen/DeepSeek gate/up/down, Mixtral w1/w3/w2). The leaf after
# `w13_`/`w2_` is the checkpoint's own leaf for both producers (weight_scale_2, input_global_scale, ...).
_FUSED = re.compile(r"(?P<module>.+\.experts)(\.routed_experts)?\.(?P<fused>w13|w2)_(?P<leaf>\w+)")
_PROJECTIONS = {"w13": ("gate_proj", "up_proj", "w1", "w3"), "w2": ("down_proj", "w2")}


def checkpoint_names(param_name: str, experts: tuple[int, ...]) -> tuple[str, ...]:
    """The parameter's own name, then the checkpoint tensors its expert rows `experts` are loaded from (a fused
    parameter: every projection it fuses, in both namings); any other parameter is only its own name."""
    m = _FUSED.fullmatch(param_name)
    if m is None:
        return (param_name,)
    return (param_name, *(f"{m['module']}.{e}.{proj}.{m['leaf']}" for e in experts
                          for proj in _PROJECTIONS[m["fused"]]))
