"""Every JUnit property quantmatrix writes, named once, with the values that carry a meaning and the encoding of
the structured ones (pytest's own junitxml.py keeps its property writer and its key format in one module too).

The plugin, the checks and the e2e tier write under these names; the report and bisect read under them. A
property is written once per case: a check records what it measured under its own name, never a host fact the
plugin already stamps on every case.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

# ------------------------------------------------------------ the case's cell (the plugin, on every case)
CHECKPOINT, SCHEME, PRODUCER, ARCH, MODE = "checkpoint", "scheme", "producer", "arch", "mode"
CHECK, KIND, TIER, CELL = "check", "kind", "tier", "cell"
LAYOUT = "layout"  # the parallel layout (tp1, tp2, tp2_ep); a cell id ends in it when it is not the serving one
# what names a case's cell rather than says what it measured
CELL_PROPERTIES = frozenset({CHECKPOINT, SCHEME, PRODUCER, ARCH, MODE, LAYOUT, CHECK, KIND, TIER, CELL})

# -------------------------------------- the host (every case, and the testsuite: per-case copies survive xdist)
VLLM_VERSION, VLLM_DISTRIBUTION = "vllm_version", "vllm_distribution"
VLLM_COMMIT, VLLM_WHEEL = "vllm_commit", "vllm_wheel"
TORCH_VERSION, PLATFORM = "torch_version", "platform"
RUNNER = "runner"
DEVICE_NAME, DEVICE_CAPABILITY = "device_name", "device_capability"  # every GPU the host detected

# ---------------------------------------------------------------------------------- testsuite only
MATRIX, TIME_LIMIT_S, HOST_ARCH, RUN_ID = "matrix", "time_limit_s", "host_arch", "run_id"
VLLM_HEALTH = "vllm_health"  # the suite's health record: `ok (...)` or `broken: ...` (adapter.health)
# every case the matrix defines and its waivers (encode_matrix_cases), so the report can tell a case the matrix
# dropped from one that went untested
MATRIX_CASES = "matrix_cases"
# a file the nightly's arch job writes when it could not test at all: `<cause>: <detail>` (CAUSES), with ARCH
SETUP_FAILURE = "setup_failure"
CAUSES = {"install": "the vLLM under test did not install", "vllm_import": "the vLLM under test does not import",
          "no_wheel": "no vLLM wheel for this CPU architecture at this commit", "refused": "the runner refused the job",
          "pytest": "pytest could not test"}

# ------------------------------------------------------------------------------ a case under a waiver
WAIVER_REASON, WAIVER_LINK = "waiver_reason", "waiver_link"
WAIVER_EXPIRES, WAIVER_EXPIRED = "waiver_expires", "waiver_expired"  # expired: "true" / "false"
WAIVER_PROPERTIES = frozenset({WAIVER_REASON, WAIVER_LINK, WAIVER_EXPIRES, WAIVER_EXPIRED})

# ---------------------------------------------------------------- a case the vLLM health gate failed
NOT_TESTED, VLLM_BROKEN = "not_tested", "vllm_broken"  # not_tested=vllm_broken: the report's "not tested"
HEALTH_BROKEN = "broken"  # how the suite's VLLM_HEALTH record starts when a part is broken

# ------------------------------------------------------------------------------ what the fixtures add
CHECKPOINT_REVISION, CHECKPOINT_SNAPSHOT = "checkpoint_revision", "checkpoint_snapshot"
SIMULATED_WITHOUT = "simulated_without"

# ------------------------------------------------------------------------------ what the checks measured
CONFIG_SHAPE, QUANT_METHOD, QUANT_CONFIG_CLASS = "config_shape", "quant_method", "quant_config_class"
RESOLVED_ALGO, RESOLVED_SCHEME = "resolved_algo", "resolved_scheme"
# ModelOpt MIXED_PRECISION: what vLLM built for each linear module outside the experts (`prefix=word (method); ...`)
MIXED_PROJECTIONS = "mixed_projections"
MOE_METHOD, MOE_BACKEND, MOE_WEIGHT_ONLY = "moe_method", "moe_backend", "moe_weight_only"
LAYER_BUILD_ERROR = "layer_build_error"
LINT_DECLARED, LINT_FINDINGS = "lint_declared", "lint_findings"
UNREVIEWED_REFERENCE = "unreviewed_reference"  # the reference file a case compared with, not yet accepted by a person
HF_GREEDY_TOKEN_IDS = "hf_greedy_token_ids"  # transformers on the host's CPU: never compared across archs
LOGIT_REL_ERROR, TOP1_AGREEMENT = "logit_rel_error", "top1_agreement"
UNLOADED_UNREAD, AUDIT_NOTES = "unloaded_unread", "audit_notes"
QUANT_CONFIG, ACTIVATION_SCALES_KEPT = "quant_config", "activation_scales_kept"
MARLIN_SCALES = "marlin_scales"  # block scales kernel_format read back through Marlin's layout (adapter.marlin_layout)
STAND_INS = "stand_ins"  # CUDA-only kernels a conversion on this host ran stand-ins for (adapter.standins)
# layer_numerics: each backend run against the dequantized reference (`BACKEND on WHERE: cos C rel R`), the ones
# whose kernel needs the gpu tier, and the overrides vLLM refused on the cell's arch
NUMERICS_RUNS, NUMERICS_GPU_TIER, NUMERICS_REFUSED = "numerics_runs", "numerics_gpu_tier", "numerics_refused"
OBSERVED_READS, DECLARED_READS, ROLES_HELD = "observed_reads", "declared_reads", "roles_held"
# a parallel layout's ranks (checks.ranks): which experts each holds, how many slots matched the reference split,
# slots no rule places, a liberty the ranks' builds took (adapter.parallel), vLLM's refusal of an impossible layout
EXPERT_PLACEMENT, SHARDS_COMPARED, SHARD_NOTES = "expert_placement", "shards_compared", "shard_notes"
LAYOUT_NOTE, LAYOUT_REFUSED = "layout_note", "layout_refused"
# device_identity: what cuda:0 of the case's own child process is (the host's list is DEVICE_NAME)
PROBED_DEVICE, PROBED_CAPABILITY = "probed_device", "probed_capability"
RESERVED_AFTER_FREE = "reserved_after_free"

# ------------------------------------------------------------------------------------- the e2e tier
ENGINE_GROUP, ENGINE_WALL_S, ENGINE_FAILURE = "engine_group", "engine_wall_s", "engine_failure"
MOE_ROUTED, ENGINE_DEVICE = "moe_routed", "engine_device"
ENGINE_VLLM, ENGINE_TORCH = "engine_vllm", "engine_torch"
SUITE_OVERHEAD_S, POISON = "suite_overhead_s", "poison"
DEGENERATION, FIRST_DIVERGENCE, ACCURACY = "degeneration", "first_divergence", "accuracy"
# uninit_reads (the sanitize mode): compute-sanitizer's report count; the model's tensors read where nobody wrote
# (JSON list: tensor, stage, reads, elements, experts, kernels), silenced ones apart with their reason and link;
# every other uninitialised read (scratch/activation memory) as JSON {kernel: reads}; whether the marker ordered the
# report (`markers`) or both records applied throughout (`unknown`); how each log was matched to a worker's record.
SANITIZER_REPORTS, UNINIT_PARAM_READS = "sanitizer_reports", "uninit_param_reads"
UNINIT_SILENCED, UNINIT_OTHER_READS, UNINIT_ORDER = "uninit_silenced", "uninit_other_reads", "uninit_order"
UNINIT_ATTRIBUTION = "uninit_attribution"
# The cell's greedy continuations of the e2e prompts, and each position's top-k as ranked token ids: recorded
# once per cell (on its degeneration case) for the report's cross-arch comparison (report.crossarch).
GREEDY_TOKEN_IDS, GREEDY_TOP_K = "greedy_token_ids", "greedy_top_k"
# Judged by the report and kept in the JUnit files, but not carried into summary.json (tomorrow's diff needs none
# of it; the night's verdict on it is summary.json's `disagreements`): ~10 KB a cell, hundreds of cells a night.
NOT_SUMMARIZED = frozenset({GREEDY_TOP_K})


def engine_timing(stage: str) -> str:
    """The property of one engine stage's seconds: `engine_load_s` for the child's `load_s`."""
    return f"engine_{stage}"


# ------------------------------------------------------------------------------ the structured values


def encode_tokens(seqs: Sequence[Sequence[int]]) -> str:
    """GREEDY_TOKEN_IDS: one list of token ids per prompt, as compact JSON."""
    return json.dumps([list(map(int, s)) for s in seqs], separators=(",", ":"))


def _int_lists(value: Any, depth: int) -> bool:
    if depth == 0:
        return type(value) is int
    return isinstance(value, list) and all(_int_lists(v, depth - 1) for v in value)


def _json(raw: str | None) -> Any:
    """A property value as JSON; None where it is absent or unreadable (a report reads any file, never raises)."""
    try:
        return json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):  # not JSON, an int too long to read, nesting deeper than Python's stack
        return None


def decode_json(raw: str | None, kind: type) -> Any:
    """A structured property (the uninit_* ones) read back; None where it is absent, unreadable or not a `kind`."""
    value = _json(raw)
    return value if isinstance(value, kind) else None


def decode_tokens(raw: str | None) -> list[list[int]] | None:
    """GREEDY_TOKEN_IDS read back; None for a value that is not a JSON list of lists of ints."""
    value = _json(raw)
    return value if _int_lists(value, 2) else None


@dataclasses.dataclass(frozen=True)
class TopK:
    """GREEDY_TOP_K: per prompt, per position, the k most likely token ids, most likely first (fewer where the
    engine gave fewer finite logprobs)."""

    k: int
    ranked: list[list[list[int]]]

    def at(self, prompt: int, position: int, k: int) -> list[int]:
        """The top-k at one position ([] beyond what was recorded)."""
        seq = self.ranked[prompt] if prompt < len(self.ranked) else []
        return seq[position][:k] if position < len(seq) else []


def encode_top_k(top: TopK) -> str:
    return json.dumps({"k": top.k, "ranked": top.ranked}, separators=(",", ":"))


def decode_top_k(raw: str | None) -> TopK | None:
    """GREEDY_TOP_K read back; None when absent or not of that shape."""
    value = _json(raw)
    if not (isinstance(value, dict) and type(value.get("k")) is int and value["k"] >= 1
            and _int_lists(value.get("ranked"), 3)):
        return None
    return TopK(value["k"], value["ranked"])


@dataclasses.dataclass(frozen=True)
class MatrixCases:
    """MATRIX_CASES: the matrix (its path from the project root), each check's cells, and each waiver with the
    cases it covers as `check[cell]`."""

    matrix: str
    cases: Mapping[str, frozenset[str]]
    waivers: Sequence[Mapping[str, Any]]  # {reason, link, expires, cases}

    def defines(self, check: str, cell: str) -> bool:
        return cell in self.cases.get(check, ())

    def waiver(self, case_id: str) -> dict[str, str] | None:
        """reason, link and expires of the waiver covering `check[cell]`, if any."""
        for w in self.waivers:
            if case_id in w["cases"]:
                return {k: w[k] for k in ("reason", "link", "expires")}
        return None


def encode_matrix_cases(found: MatrixCases) -> str:
    return json.dumps({"matrix": found.matrix, "cases": {k: sorted(v) for k, v in found.cases.items()},
                       "waivers": [dict(w, cases=sorted(w["cases"])) for w in found.waivers]}, separators=(",", ":"))


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def decode_matrix_cases(raw: str | None) -> MatrixCases | None:
    """MATRIX_CASES read back; None when absent or not of that shape (a report reads any file, never raises)."""
    value = _json(raw)
    if not (isinstance(value, dict) and isinstance(value.get("matrix"), str) and isinstance(value.get("cases"), dict)
            and all(_strings(v) for v in value["cases"].values()) and isinstance(value.get("waivers"), list)):
        return None
    waivers = value["waivers"]
    if not all(isinstance(w, dict) and all(isinstance(w.get(k), str) for k in ("reason", "link", "expires"))
               and _strings(w.get("cases")) for w in waivers):
        return None
    return MatrixCases(value["matrix"], {k: frozenset(v) for k, v in value["cases"].items()},
                       [dict(w, cases=frozenset(w["cases"])) for w in waivers])
