"""Config-level dispatch against the installed vLLM: every config shape, and the seed bug caught when the fix
is reverted."""

from __future__ import annotations

from pathlib import Path

import pytest
from matrixkit import case_for
from prefix_bug import revert_weight_only_promotion

from quantmatrix.adapter import config
from quantmatrix.checkpoints import store
from quantmatrix.checks import dispatch
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = load(ROOT / "matrices" / "default.yaml")
WEIGHT_ONLY_NVFP4_ALGO = ["qwen3moe-tiny-nvfp4-weight-only", "qwen3moe-tiny-nvfp4-weight-only-key-missing",
                          "mixtral-tiny-nvfp4-weight-only", "qwen3moe-tiny-nvfp4-weight-only-stray-input-scales"]


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path_factory.getbasetemp() / "qm-cache"))


def _resolve(checkpoint_id: str) -> tuple[config.Resolution, str]:
    ck = next(c for c in DEFAULT.checkpoints if c.id == checkpoint_id)
    path = store.materialize(ck)
    return config.resolve(path), dispatch.config_shape(path)


@pytest.mark.parametrize(("checkpoint_id", "scheme", "algo", "shape"), [
    ("qwen3moe-tiny-nvfp4-weight-only", "weight_only", "W4A16_NVFP4", "input_activations=null"),
    ("qwen3moe-tiny-nvfp4-weight-only-key-missing", "weight_only", "W4A16_NVFP4", "input_activations=missing"),
    ("qwen3moe-tiny-nvfp4-w4a4", "w4a4", "NVFP4", "input_activations=quantized"),
    ("qwen3moe-tiny-nvfp4-activations-empty", "w4a4", "NVFP4", "input_activations=empty"),
    ("qwen3moe-tiny-nvfp4-groups-empty", "w4a4", "NVFP4", "config_groups empty"),
    ("qwen3moe-tiny-nvfp4-groups-missing", "w4a4", "NVFP4", "config_groups missing"),
    ("qwen3moe-tiny-nvfp4-w4a4-legacy", "w4a4", "NVFP4", "hf_quant_config.json (legacy)"),
    ("qwen3moe-tiny-nvfp4-w4a16-legacy", "rejected", "", "hf_quant_config.json (legacy); quant_algo=W4A16_NVFP4"),
    ("qwen3moe-tiny-ct-nvfp4a16", "weight_only", "NVFP4A16 (input_activations None)", "input_activations=null"),
    ("qwen3moe-tiny-ct-nvfp4-activations-empty", "weight_only", "NVFP4A16 (input_activations None)",
     "input_activations=empty"),
    ("qwen3moe-tiny-ct-nvfp4-w4a4", "w4a4", "NVFP4 (input_activations set)", "input_activations=quantized"),
    ("qwen3moe-tiny-bf16", "unquantized", "", "no quantization config"),
])
def test_each_config_shape_resolves_as_measured(checkpoint_id, scheme, algo, shape):
    """vLLM's real resolution of each shape (pinned: a vLLM that changes one shows up here by name)."""
    got, seen_shape = _resolve(checkpoint_id)
    assert (got.scheme, got.algo) == (scheme, algo), got
    assert shape in seen_shape


def test_reverted_fix_routes_weight_only_to_w4a4_with_a_message_about_input_scale(monkeypatch):
    """With the promotion reverted, the seed checkpoint resolves to W4A4 and the verdict explains the damage."""
    revert_weight_only_promotion(monkeypatch)
    ck = next(c for c in DEFAULT.checkpoints if c.id == "qwen3moe-tiny-nvfp4-weight-only")
    got, shape = _resolve(ck.id)
    assert got.scheme == "w4a4"
    problem = dispatch.config_verdict(case_for(DEFAULT, ck.id, "config_dispatch"), store.materialize(ck), got).problem
    assert problem.startswith("weight-only NVFP4 checkpoint resolved to W4A4 NVFP4 (modelopt_fp4/NVFP4): "
                              "the fused-MoE path would fold an uninitialised input_scale into g1_alphas")


def _dispatch_run(pytester: pytest.Pytester, *extra: str) -> pytest.RunResult:
    return pytester.runpytest(str(ROOT / "suites" / "test_dispatch.py"), f"--rootdir={ROOT}",
                              "-p", "no:cacheprovider", "-m", "dispatch and sm121 and default", *extra)


def test_dispatch_suite_passes_on_installed_vllm(pytester):
    """Every config-dispatch case of the default matrix passes against the unmodified installed vLLM."""
    result = _dispatch_run(pytester)
    result.assert_outcomes(passed=len(DEFAULT.checkpoints))


def test_dispatch_suite_fails_exactly_the_weight_only_cells_when_the_fix_is_reverted(pytester, monkeypatch):
    """Pre-fix vLLM: the weight-only checkpoints that say quant_algo NVFP4 fail, naming input_scale; no others."""
    revert_weight_only_promotion(monkeypatch)
    result = _dispatch_run(pytester, "-rf")
    n = len(WEIGHT_ONLY_NVFP4_ALGO)
    result.assert_outcomes(passed=len(DEFAULT.checkpoints) - n, failed=n)
    failed = sorted(line.split("[")[1].split("@")[0] for line in result.outlines if line.startswith("FAILED"))
    assert failed == sorted(WEIGHT_ONLY_NVFP4_ALGO)
    result.stdout.fnmatch_lines(["*weight-only NVFP4 checkpoint resolved to W4A4 NVFP4*uninitialised input_scale*"])
