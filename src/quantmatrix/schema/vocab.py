"""Closed vocabularies of the matrix: every word a matrix may use for a producer, tier, expectation, tensor role
or finding. The parts that act on them (lint, audit, adapter) import them from here."""

from __future__ import annotations

PRODUCERS = ("modelopt", "compressed-tensors", "none")
TIERS = ("cpu", "gpu")
VLLM_PARTS = ("config", "layers", "engine")  # what a check imports of vLLM (adapter.health checks each)
RESOLUTIONS = ("weight_only", "w4a4", "unquantized", "rejected")
# What an NVFP4 MoE kernel can read; vLLM's parameter names map onto these in adapter.roles.
ROLES = ("weight", "block_scale", "global_scale", "input_scale")
ACTIVATION_SCALES = ("read", "not_read", "any")
AUDIT_FAILURES = ("unloaded", "nonfinite", "zero", "negative", "refused")
SELECTOR_KEYS = ("checkpoint", "arch", "mode", "scheme", "producer", "check")
# Finding codes of the checkpoint lint (checkpoints.lint).
LINT_CODES = ("config", "missing_tensor", "unexpected_tensor", "bad_dtype", "bad_shape", "bad_value", "unquantized",
              "quantized_but_ignored", "inconsistent")
