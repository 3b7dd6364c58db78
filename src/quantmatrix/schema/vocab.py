"""Closed vocabularies of the matrix: every word a matrix may use for a producer, tier, expectation, tensor role
or finding. The parts that act on them (lint, audit, adapter) import them from here."""

from __future__ import annotations

import re

from quantmatrix.schema import factory

PRODUCERS = tuple(factory.PRODUCERS)  # who made a checkpoint; the factory writes each (schema.factory)
TIERS = ("cpu", "gpu")
VLLM_PARTS = ("config", "layers", "engine")  # what a check imports of vLLM (adapter.health checks each)
# What a cpu cell may need of the host that runs it on vLLM's CPU build (`cpu_cells[].needs`; host.cpu says what
# each means and detects it): vLLM's Zen CPU platform (zentorch's experts), Intel AMX tiles (vLLM's own CPU experts).
HOST_NEEDS = ("zen_cpu", "amx")
# How a checkpoint's MoE runs: NVFP4 weight-only / W4A4, FP8 with static per-tensor activation scales, dynamic
# per-token activations, or 128x128 weight blocks (dynamic per-group activations); INT8 weights per channel with
# dynamic per-token INT8 activations; INT4 weights in groups with dynamic per-token FP8 activations; MXFP4 weights
# (E8M0 scales per 32 inputs) with bf16 activations in the checkpoint, which the backend runs as bf16 or quantizes
# to MXFP8 itself; MXFP8 weights (E4M3, E8M0 scales per 32 inputs) with bf16 activations in the checkpoint.
RESOLUTIONS = ("weight_only", "w4a4", "fp8_static", "fp8_dynamic", "fp8_block", "w8a8_int8", "w4a8_fp8", "mxfp4",
               "mxfp8", "unquantized", "rejected")
# What an NVFP4 MoE kernel can read; each producer names its tensors per role (checkpoints.producers, role_of).
ROLES = ("weight", "block_scale", "global_scale", "input_scale", "zero_point", "g_idx", "weight_shape")
ACTIVATION_SCALES = ("read", "not_read", "any")
AUDIT_FAILURES = ("unloaded", "nonfinite", "zero", "negative", "refused", "misplaced")
SELECTOR_KEYS = ("checkpoint", "arch", "mode", "layout", "scheme", "producer", "check")
# Finding codes of the checkpoint lint (checkpoints.lint).
LINT_CODES = ("config", "missing_tensor", "unexpected_tensor", "bad_dtype", "bad_shape", "bad_value", "unquantized",
              "quantized_but_ignored", "inconsistent")
# A hub checkpoint's id and revision, checked before either touches a cache path or a printed command: `owner/name`
# as the hub spells them, and a 40-hex commit or a plain branch/tag name (`refs/pr/N` too); nothing that can climb
# out of the cache (`..`, a leading `/`) or start a second shell command.
HUB_REPO = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}"
HUB_COMMIT = r"[0-9a-f]{40}"
HUB_REVISION = HUB_COMMIT + r"|refs/pr/[0-9]{1,9}|[A-Za-z0-9][A-Za-z0-9_.-]{0,99}"


def bad_hub_repo(repo: str) -> str | None:
    """Why a hub id is refused, or None."""
    ok = re.fullmatch(HUB_REPO, repo) and ".." not in repo
    return None if ok else f"hub id {repo!r} is not owner/name (letters, digits, '-', '_', '.')"


def bad_hub_revision(revision: str) -> str | None:
    """Why a hub revision is refused, or None."""
    ok = re.fullmatch(HUB_REVISION, revision) and ".." not in revision
    return None if ok else f"revision {revision!r} is neither a 40-hex commit nor a plain branch or tag name"
