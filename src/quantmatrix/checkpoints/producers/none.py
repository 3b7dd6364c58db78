"""The unquantized "producer" of a family's bf16 member: transformers' own names, no quantization config."""

from __future__ import annotations

from typing import Any

from quantmatrix.schema.synthetic import SyntheticSpec

LEAVES = {"bf16": {"weight": "weight"}}
RECIPES: dict[str, Any] = {}  # nothing to quantize


def config_files(spec: SyntheticSpec, plain: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The unquantized model's config files as they are."""
    return dict(plain)
