"""Every branch of the dispatch (config and layer) and kernel_format verdicts, and every degeneration threshold at
its boundary, on constructed inputs from the default matrix's own cells: each check must be able to fail.

The layer and the kernel format are constructed (a MoE backend choice and a post-load quant config are what a GPU
run would produce); the cases, expectations and backends are the real matrix's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from matrixkit import case_for

from quantmatrix.adapter.config import Resolution
from quantmatrix.adapter.kernel import KernelFormat, read_quant_config
from quantmatrix.adapter.layers import LayerBuild, MoELayer
from quantmatrix.checks import dispatch, kernel
from quantmatrix.checks.quality import Degeneration
from quantmatrix.errors import AdapterMismatch, MatrixError
from quantmatrix.schema.load import load
from quantmatrix.schema.model import PerArch

ROOT = Path(__file__).resolve().parents[1]
WO, W4A4 = "qwen3moe-tiny-nvfp4-weight-only", "qwen3moe-tiny-nvfp4-w4a4"
REJECTED = "qwen3moe-tiny-nvfp4-w4a16-legacy"


@pytest.fixture(scope="module")
def matrix():
    return load(ROOT / "matrices" / "default.yaml")


def _build(backend: str, weight_only: bool) -> LayerBuild:
    layer = MoELayer(None, None, "model.layers.0.mlp.", "ModelOptNvFp4FusedMoE", backend, weight_only, None, 4)
    return LayerBuild(layer, None)


def _layer(matrix, ck: str, backend: str, weight_only: bool, arch: str = "sm121") -> str | None:
    return dispatch.layer_verdict(case_for(matrix, ck, "layer_dispatch", arch), _build(backend, weight_only),
                                  matrix.moe_backends).problem


# ------------------------------------------------------------------------------------------ layer dispatch


def test_weight_only_method_on_a_backend_that_reads_input_scale_is_the_seed_bug(matrix):
    """The method says weight-only but the backend is a W4A4 fused MoE reading input_scale: the layer verdict
    itself fails (not only the audit), naming the backend and the uninitialised read."""
    problem = _layer(matrix, WO, "VLLM_CUTLASS", weight_only=True)
    assert problem == ("weight-only checkpoint routed to W4A4 fused MoE backend VLLM_CUTLASS on sm121 (GB10 / DGX "
                       "Spark): input_scale would be read uninitialised (the checkpoint has none)")


def test_weight_only_checkpoint_on_marlin_passes(matrix):
    assert _layer(matrix, WO, "MARLIN", weight_only=True) is None


def test_weight_only_checkpoint_built_as_w4a4_method_fails_with_the_consequence(matrix):
    problem = _layer(matrix, WO, "VLLM_CUTLASS", weight_only=False)
    assert problem.startswith("weight-only NVFP4 checkpoint built as W4A4 NVFP4 MoE (ModelOptNvFp4FusedMoE, "
                              "backend VLLM_CUTLASS) on sm121")
    assert "uninitialised input_scale into g1_alphas" in problem


def test_w4a4_checkpoint_on_a_backend_that_never_reads_activation_scales_fails(matrix):
    problem = _layer(matrix, W4A4, "HUMMING", weight_only=False)
    assert problem.startswith("W4A4 checkpoint routed to HUMMING on sm121") and "run unquantized" in problem


def test_w4a4_checkpoint_on_a_w4a4_backend_passes_and_sm90_accepts_any(matrix):
    assert _layer(matrix, W4A4, "VLLM_CUTLASS", weight_only=False) is None
    assert _layer(matrix, W4A4, "HUMMING", weight_only=False, arch="sm90") is None  # activation_scales: any


def test_a_backend_the_matrix_does_not_describe_fails_naming_the_known_ones(matrix):
    problem = _layer(matrix, WO, "NEW_BACKEND", weight_only=True)
    assert problem.startswith("vLLM selected MoE backend NEW_BACKEND on sm121") and "MARLIN" in problem


def test_a_pinned_backend_is_enforced(matrix):
    case = case_for(matrix, W4A4, "layer_dispatch")
    ck = dataclasses.replace(case.cell.checkpoint, expect={**case.cell.checkpoint.expect,
                                                            "moe_backend": PerArch({"*": ["FLASHINFER_CUTLASS"]})})
    pinned = dataclasses.replace(case, cell=dataclasses.replace(case.cell, checkpoint=ck))
    problem = dispatch.layer_verdict(pinned, _build("VLLM_CUTLASS", False), matrix.moe_backends).problem
    assert problem == ("MoE backend VLLM_CUTLASS selected on sm121 (GB10 / DGX Spark); the matrix pins "
                       "FLASHINFER_CUTLASS for this arch")


def test_no_layer_fails_unless_a_refusal_is_expected(matrix):
    refused = LayerBuild(None, "ValueError: no backend")
    case = case_for(matrix, WO, "layer_dispatch")
    assert dispatch.layer_verdict(case, refused, matrix.moe_backends).problem == (
        "vLLM could not build the MoE layer on sm121 (GB10 / DGX Spark): ValueError: no backend")
    rejected = case_for(matrix, REJECTED, "layer_dispatch")
    assert dispatch.layer_verdict(rejected, refused, matrix.moe_backends).problem is None
    built = dispatch.layer_verdict(rejected, _build("MARLIN", True), matrix.moe_backends).problem
    assert built.endswith("for a config the matrix says it must refuse")


# ----------------------------------------------------------------------------------------- config dispatch


@pytest.fixture
def ck_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))
    return tmp_path


def _config(matrix, ck: str, ck_dir: Path, got: Resolution) -> str | None:
    return dispatch.config_verdict(case_for(matrix, ck, "config_dispatch"), ck_dir, got).problem


WO_RES = Resolution("modelopt_fp4", "ModelOptNvFp4Config", "W4A16_NVFP4", "weight_only")
W4A4_RES = Resolution("modelopt_fp4", "ModelOptNvFp4Config", "NVFP4", "w4a4")


def test_config_weight_only_resolved_to_w4a4_names_the_seed_bug(matrix, ck_dir):
    assert _config(matrix, WO, ck_dir, WO_RES) is None
    problem = _config(matrix, WO, ck_dir, W4A4_RES)
    assert problem.startswith("weight-only NVFP4 checkpoint resolved to W4A4 NVFP4 (modelopt_fp4/NVFP4): the "
                              "fused-MoE path would fold an uninitialised input_scale into g1_alphas")


def test_config_wrong_quant_method_fails(matrix, ck_dir):
    got = dataclasses.replace(WO_RES, method="compressed-tensors")
    assert _config(matrix, WO, ck_dir, got).startswith(
        "checkpoint claimed by vLLM quantization method 'compressed-tensors', expected 'modelopt_fp4'")


def test_config_rejection_where_a_scheme_is_expected_fails_with_vllms_words(matrix, ck_dir):
    got = Resolution("?", "", "", "rejected", "Value error, boom")
    assert _config(matrix, WO, ck_dir, got).startswith(
        "weight-only NVFP4 checkpoint was rejected by vLLM: Value error, boom")


def test_an_expected_rejection_must_be_for_the_stated_reason(matrix, ck_dir):
    """A refusal that matches `rejected_because` passes; any other refusal fails; a resolution fails."""
    right = Resolution("?", "", "", "rejected", "Value error, Unknown ModelOpt quant algo: W4A16_NVFP4")
    wrong = Resolution("?", "", "", "rejected", "Value error, something else broke")
    assert _config(matrix, REJECTED, ck_dir, right) is None
    assert _config(matrix, REJECTED, ck_dir, wrong).startswith(
        "vLLM rejected the config, but not for the reason the matrix expects: 'Value error, something else broke'")
    assert "must refuse this config rather than guess a kernel" in _config(matrix, REJECTED, ck_dir, WO_RES)


def test_an_expected_rejection_without_a_stated_reason_is_a_matrix_error(matrix, ck_dir):
    case = case_for(matrix, REJECTED, "config_dispatch")
    expect = {k: v for k, v in case.cell.checkpoint.expect.items() if k != "rejected_because"}
    ck = dataclasses.replace(case.cell.checkpoint, expect=expect)
    bare = dataclasses.replace(case, cell=dataclasses.replace(case.cell, checkpoint=ck))
    with pytest.raises(MatrixError, match="states no expectation 'rejected_because'"):
        dispatch.config_verdict(bare, ck_dir, Resolution("?", "", "", "rejected", "anything"))


def test_a_crash_inside_vllm_config_resolution_stays_an_error(monkeypatch, ck_dir):
    """A KeyError from vLLM is a crash, not a refusal: it propagates (the case errors) instead of passing a
    `resolves_to: rejected` cell."""
    from quantmatrix.adapter import config

    def crash(*a, **k):
        raise KeyError("quant_algo")

    monkeypatch.setattr(config, "entry_points", lambda: (None, lambda: None, crash))
    monkeypatch.setattr(config, "model_config", lambda d: SimpleNamespace(quantization="modelopt_fp4"))
    with pytest.raises(KeyError):
        config.resolve(ck_dir)
    monkeypatch.setattr(config, "entry_points",
                        lambda: (None, lambda: None, lambda *a: (_ for _ in ()).throw(ValueError("no"))))
    assert config.resolve(ck_dir).scheme == "rejected"


# ------------------------------------------------------------------------------------------- kernel_format


def _kernel(matrix, ck: str, backend: str, kf: KernelFormat | None, build: LayerBuild | None = None):
    case = case_for(matrix, ck, "kernel_format")
    return kernel.kernel_verdict(case, build or _build(backend, ck == WO), matrix.moe_backends, kf)


GOOD = {"g1_alphas": True, "g2_alphas": True}


def test_kernel_format_passes_only_with_finite_alphas_and_the_right_activation_scales(matrix):
    assert _kernel(matrix, WO, "MARLIN", KernelFormat(None, "Q", GOOD, ())).problem is None
    assert _kernel(matrix, W4A4, "VLLM_CUTLASS", KernelFormat(None, "Q", GOOD, ("a1_gscale",))).problem is None


def test_kernel_format_fails_without_a_quant_config(matrix):
    problem = _kernel(matrix, WO, "MARLIN", KernelFormat(None, None)).problem
    assert problem.endswith("vLLM built no fused-MoE quant config after conversion, so nothing says what the "
                            "kernel reads")


def test_kernel_format_fails_on_missing_or_nonfinite_alphas(matrix):
    missing = _kernel(matrix, WO, "MARLIN", KernelFormat(None, "Q", {"g1_alphas": None, "g2_alphas": True}))
    assert "holds no g1_alphas: the dequant alphas are gone" in missing.problem
    nan = _kernel(matrix, WO, "MARLIN", KernelFormat(None, "Q", {"g1_alphas": True, "g2_alphas": False}))
    assert "g2_alphas hold non-finite values" in nan.problem


def test_kernel_format_alphas_are_not_required_of_a_backend_that_keeps_its_own(matrix):
    assert _kernel(matrix, WO, "HUMMING", KernelFormat(None, "Q", {}, ())).problem is None


def test_kernel_format_activation_scales_kept_for_weight_only_or_dropped_for_w4a4_fail(matrix):
    kept = _kernel(matrix, WO, "MARLIN", KernelFormat(None, "Q", GOOD, ("a1_gscale",))).problem
    assert "weight-only checkpoint, yet the kernel format carries activation scales (a1_gscale)" in kept
    dropped = _kernel(matrix, W4A4, "VLLM_CUTLASS", KernelFormat(None, "Q", GOOD, ())).problem
    assert "calibrated activation scales were dropped" in dropped


def test_kernel_format_compares_the_activation_scales_kept_with_the_backends_read_set(matrix):
    """A W4A4 checkpoint whose matrix accepts any activation scales (sm90) is still held to its backend's read-set:
    a backend that reads input_scale must be handed one, a backend said never to read it must not be."""
    fp8 = "qwen3moe-tiny-mo-fp8"  # activation_scales: any
    dropped = _kernel(matrix, fp8, "FP8_FLASHINFER_CUTLASS", KernelFormat(None, "Q", GOOD, ())).problem
    assert "read-set (quantmatrix/data/backends.yaml) says FP8_FLASHINFER_CUTLASS reads input_scale" in dropped
    handed = _kernel(matrix, fp8, "FP8_MARLIN", KernelFormat(None, "Q", {}, ("a1_scale", "a2_scale"))).problem
    assert "hands the kernel a1_scale, a2_scale, but the read-set" in handed
    assert "says FP8_MARLIN never reads input_scale" in handed
    assert _kernel(matrix, fp8, "FP8_MARLIN", KernelFormat(None, "Q", {}, ())).problem is None


def test_kernel_format_skips_a_conversion_vllm_refuses_out_loud_naming_it(matrix):
    kf = KernelFormat(None, refused="conversion for VLLM_CUTLASS refuses this layer out loud (NotImplementedError)")
    v = _kernel(matrix, W4A4, "VLLM_CUTLASS", kf)
    assert v.problem is None and v.reason.startswith("conversion for VLLM_CUTLASS refuses this layer out loud")


def test_kernel_format_unknown_backend_needs_cuda_and_refusals(matrix):
    assert "is not described under moe_backends" in _kernel(matrix, WO, "NEW", KernelFormat(None, "Q", GOOD)).problem
    skipped = _kernel(matrix, WO, "MARLIN", KernelFormat("needs CUDA: gptq_marlin_repack"))
    assert skipped.problem is None and skipped.reason == "needs CUDA: gptq_marlin_repack"
    refused = LayerBuild(None, "ValueError: x")
    assert _kernel(matrix, WO, "", None, refused).problem == "vLLM refused to build the MoE layer: ValueError: x"
    assert _kernel(matrix, REJECTED, "", None, refused).reason.startswith("vLLM refuses this config")


def test_reading_the_quant_config_never_counts_an_empty_alpha_as_finite():
    """`all()` over no values is True: an empty g1_alphas is absent, a NaN one non-finite, and a quant config
    without the fields at all is an adapter mismatch (a vLLM that renamed them), not a dropped scale."""
    full = SimpleNamespace(g1_alphas=torch.ones(4), g2_alphas=torch.empty(0), a1_gscale=None, a2_gscale=None,
                           a1_scale=None, a2_scale=None)
    assert read_quant_config(full).alphas == {"g1_alphas": True, "g2_alphas": None}
    full.g1_alphas = torch.tensor([1.0, float("nan")])
    assert read_quant_config(full).alphas["g1_alphas"] is False
    with pytest.raises(AdapterMismatch, match="has no a1_gscale, a2_gscale, a1_scale, a2_scale"):
        read_quant_config(SimpleNamespace(g1_alphas=None, g2_alphas=None))


# ------------------------------------------------------------------------------- degeneration thresholds

LIMITS = {"max_repeat_run": 6, "min_distinct_1": 0.2, "min_distinct_2": 0.3, "max_compression_ratio": 6.0}
AT = Degeneration(6, 0, 0.2, 0.3, 6.0)


def test_degeneration_at_every_threshold_passes_and_one_step_past_each_fails():
    assert AT.crossed(LIMITS) == []
    past = {"max_repeat_run": dataclasses.replace(AT, max_repeat_run=7),
            "min_distinct_1": dataclasses.replace(AT, distinct_1=0.199),
            "min_distinct_2": dataclasses.replace(AT, distinct_2=0.299),
            "max_compression_ratio": dataclasses.replace(AT, compression_ratio=6.01)}
    for limit, metrics in past.items():
        (crossed,) = metrics.crossed(LIMITS)
        assert limit in crossed, (limit, crossed)
