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
