"""The dispatch and kernel_format verdicts word for word: every message, every recorded property and the config
shape of every config form, on the default matrix's own cells. tests/test_verdict_branches.py proves each branch
can fail; these pin what the failure says (a maintainer reads it), so a drifted message or property turns a test
red (bench/mutation.py measures it)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from matrixkit import case_for

from quantmatrix import properties as P
from quantmatrix.adapter.config import Resolution
from quantmatrix.adapter.kernel import KernelFormat
from quantmatrix.adapter.layers import LayerBuild, MoELayer
from quantmatrix.checks import dispatch, kernel
from quantmatrix.schema.load import load
from quantmatrix.schema.model import PerArch

ROOT = Path(__file__).resolve().parents[1]
WO, W4A4, BF16 = "qwen3moe-tiny-nvfp4-weight-only", "qwen3moe-tiny-nvfp4-w4a4", "qwen3moe-tiny-bf16"
REJECTED = "qwen3moe-tiny-nvfp4-w4a16-legacy"
ON = "on sm121 (GB10 / DGX Spark)"
SHAPE = "no quantization config"
GOOD = {"g1_alphas": True, "g2_alphas": True}


@pytest.fixture(scope="module")
def matrix():
    return load(ROOT / "matrices" / "default.yaml")


def _write(d: Path, qc: object = None, legacy: object = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"} | (
        {"quantization_config": qc} if qc is not None else {})))
    if legacy is not None:
        (d / "hf_quant_config.json").write_text(json.dumps(legacy))
    return d


# ------------------------------------------------------------------------------------------ config shape


@pytest.mark.parametrize(("qc", "shape"), [
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"},
     "config.json quantization_config; quant_method=modelopt; quant_algo=NVFP4; config_groups missing"),
    ({"quant_method": "modelopt", "config_groups": {}},
     "config.json quantization_config; quant_method=modelopt; config_groups empty"),
    ({"quant_method": "compressed-tensors", "config_groups": [1]},
     "config.json quantization_config; quant_method=compressed-tensors; config_groups is a list"),
    ({"quant_method": "compressed-tensors", "config_groups": {
        "a": {"input_activations": None}, "b": {}, "c": {"input_activations": {}}, "d": {"input_activations": {"x": 1}},
        "e": {"input_activations": [1]}, "f": 3}},
     "config.json quantization_config; quant_method=compressed-tensors; 6 config group(s); "
     "input_activations=empty/missing/not-a-mapping/null/quantized/unexpected list"),
])
def test_config_shape_names_the_rule_that_decided(tmp_path, qc, shape):
    assert dispatch.config_shape(_write(tmp_path, qc)) == shape


def test_config_shape_of_a_legacy_and_an_unquantized_config(tmp_path):
    assert dispatch.config_shape(_write(tmp_path / "a")) == SHAPE
    legacy = _write(tmp_path / "b", legacy={"quantization": {"quant_algo": "NVFP4"}})
    assert dispatch.config_shape(legacy) == "hf_quant_config.json (legacy); quant_algo=NVFP4; no config_groups"
    assert dispatch.config_shape(_write(tmp_path / "c", legacy={})) == (
        "hf_quant_config.json (legacy); quant_algo=None; no config_groups")


# ----------------------------------------------------------------------------------------- config verdict


def _config(matrix, ck: str, d: Path, got: Resolution):
    return dispatch.config_verdict(case_for(matrix, ck, "config_dispatch"), d, got)


def test_config_verdict_records_what_vllm_decided(matrix, tmp_path):
    got = Resolution("modelopt_fp4", "ModelOptNvFp4Config", "W4A16_NVFP4", "weight_only")
    v = _config(matrix, WO, _write(tmp_path), got)
    assert v.problem is None and v.reason is None
    assert v.properties == ((P.CONFIG_SHAPE, SHAPE), (P.QUANT_METHOD, "modelopt_fp4"),
                            (P.QUANT_CONFIG_CLASS, "ModelOptNvFp4Config"), (P.RESOLVED_ALGO, "W4A16_NVFP4"),
                            (P.RESOLVED_SCHEME, "weight_only"))


NVFP4_ON_BF16 = "packed NVFP4 weights would be loaded into bf16 layers"
BF16_ON_NVFP4 = "a bf16 checkpoint would be loaded through an NVFP4 kernel"


@pytest.mark.parametrize(("ck", "got", "message"), [
    (W4A4, Resolution("modelopt_fp4", "C", "W4A16_NVFP4", "weight_only"),
     "W4A4 NVFP4 checkpoint resolved to weight-only NVFP4 (modelopt_fp4/W4A16_NVFP4): the calibrated input_scale "
     "would be ignored and activations would run unquantized through Marlin: not the kernel this checkpoint was "
     "exported for"),
    (WO, Resolution("none", "", "", "unquantized"),
     f"weight-only NVFP4 checkpoint resolved to unquantized (none): {NVFP4_ON_BF16}"),
    (W4A4, Resolution("none", "", "", "unquantized"),
     f"W4A4 NVFP4 checkpoint resolved to unquantized (none): {NVFP4_ON_BF16}"),
    (BF16, Resolution("modelopt_fp4", "C", "NVFP4", "w4a4"),
     f"unquantized checkpoint resolved to W4A4 NVFP4 (modelopt_fp4/NVFP4): {BF16_ON_NVFP4}"),
    (BF16, Resolution("modelopt_fp4", "C", "W4A16_NVFP4", "weight_only"),
     f"unquantized checkpoint resolved to weight-only NVFP4 (modelopt_fp4/W4A16_NVFP4): {BF16_ON_NVFP4}"),
    (WO, Resolution("?", "", "", "rejected", "Value error, boom"),
     "weight-only NVFP4 checkpoint was rejected by vLLM: Value error, boom"),
    (REJECTED, Resolution("modelopt_fp4", "C", "", "weight_only"),
     "a rejected checkpoint resolved to weight-only NVFP4 (modelopt_fp4): the matrix says vLLM must refuse this "
     "config rather than guess a kernel"),
    (REJECTED, Resolution("?", "", "", "rejected", "Value error, other"),
     "vLLM rejected the config, but not for the reason the matrix expects: 'Value error, other' does not match "
     "'Unknown ModelOpt quant algo: W4A16_NVFP4'"),
    (WO, Resolution("compressed-tensors", "C", "", "weight_only"),
     "checkpoint claimed by vLLM quantization method 'compressed-tensors', expected 'modelopt_fp4'"),
    ("qwen3moe-tiny-gptq-w4a16-desc-act", Resolution("auto_gptq", "C", "GPTQ", "weight_only"),  # vLLM 0.28 serves it
     "a rejected checkpoint resolved to weight-only integer (WNA16) (auto_gptq/GPTQ): the matrix says vLLM must "
     "refuse this config rather than guess a kernel"),
])
def test_every_config_problem_word_for_word(matrix, tmp_path, ck, got, message):
    assert _config(matrix, ck, _write(tmp_path), got).problem == f"{message} [config shape: {SHAPE}]"


def test_an_expected_rejection_for_the_stated_reason_passes(matrix, tmp_path):
    got = Resolution("?", "", "", "rejected", "pydantic: Unknown ModelOpt quant algo: W4A16_NVFP4 (see docs)")
    assert _config(matrix, REJECTED, _write(tmp_path), got).problem is None


# ------------------------------------------------------------------------------------------ layer verdict


def _build(backend: str, weight_only: bool) -> LayerBuild:
    layer = MoELayer(None, None, "model.layers.0.mlp.", "ModelOptNvFp4FusedMoE", backend, weight_only, None, 4)
    return LayerBuild(layer, None)


def _layer(matrix, ck: str, build: LayerBuild, arch: str = "sm121"):
    return dispatch.layer_verdict(case_for(matrix, ck, "layer_dispatch", arch), build, matrix.moe_backends)


def test_layer_verdict_records_the_method_and_backend(matrix):
    v = _layer(matrix, WO, _build("MARLIN", True))
    assert v.problem is None and v.properties == (
        (P.MOE_METHOD, "ModelOptNvFp4FusedMoE"), (P.MOE_BACKEND, "MARLIN"), (P.MOE_WEIGHT_ONLY, "true"),
        (P.LAYER_BUILD_ERROR, ""))
    assert _layer(matrix, W4A4, _build("VLLM_CUTLASS", False)).properties[2] == (P.MOE_WEIGHT_ONLY, "false")
    refused = _layer(matrix, WO, LayerBuild(None, "ValueError: x"))
    assert refused.properties == ((P.MOE_METHOD, ""), (P.MOE_BACKEND, ""), (P.MOE_WEIGHT_ONLY, ""),
                                  (P.LAYER_BUILD_ERROR, "ValueError: x"))


@pytest.mark.parametrize(("ck", "build", "message"), [
    (REJECTED, _build("MARLIN", True),
     f"vLLM built ModelOptNvFp4FusedMoE with backend MARLIN {ON} for a config the matrix says it must refuse"),
    (W4A4, _build("MARLIN", True),
     f"W4A4 NVFP4 checkpoint built as weight-only NVFP4 MoE (ModelOptNvFp4FusedMoE, backend MARLIN) {ON}: the "
     "calibrated input_scale would be ignored and activations would run unquantized through Marlin: not the kernel "
     "this checkpoint was exported for"),
    (WO, _build("VLLM_CUTLASS", False),
     f"weight-only NVFP4 checkpoint built as W4A4 NVFP4 MoE (ModelOptNvFp4FusedMoE, backend VLLM_CUTLASS) {ON}: "
     "the fused-MoE path would fold an uninitialised input_scale into g1_alphas (the checkpoint has none), zeroing "
     "or scaling every expert by whatever memory held"),
    (W4A4, _build("NEW", False),
     f"vLLM selected MoE backend NEW {ON}, which the matrix does not describe: add it under moe_backends with the "
     "tensors it reads (known: MARLIN, HUMMING, VLLM_CUTLASS, FLASHINFER_CUTLASS, FLASHINFER_TRTLLM, "
     "FLASHINFER_CUTEDSL, EMULATION, FP8_TRITON, FP8_DYNAMIC_TRITON, FP8_VLLM_CUTLASS, FP8_DYNAMIC_VLLM_CUTLASS, "
     "FP8_DYNAMIC_DEEPGEMM, FP8_FLASHINFER_CUTLASS, FP8_DYNAMIC_FLASHINFER_CUTLASS, FP8_FLASHINFER_TRTLLM, "
     "FP8_DYNAMIC_FLASHINFER_TRTLLM, FP8_MARLIN, FP8_DYNAMIC_MARLIN, FP8_DYNAMIC_HUMMING, FP8_CPU, FP8_DYNAMIC_CPU, "
     "INT8_TRITON, INT8_HUMMING, INT8_CPU, WNA16_TRITON, "
     "WNA16_MARLIN, WNA16_BATCHED_MARLIN, WNA16_HUMMING, WNA16_FLASHINFER_TRTLLM, WNA16_EMULATION, WNA16_CPU, "
     "WNA16_ZEN_CPU, MXFP4_FLASHINFER_TRTLLM_MXFP4_BF16, MXFP4_FLASHINFER_TRTLLM_MXFP4_MXFP8, MXFP4_TRITON, "
     "MXFP4_FLASHINFER_CUTLASS_MXFP4_BF16, MXFP4_FLASHINFER_CUTLASS_MXFP4_MXFP8, MXFP4_CUTLASS_MXFP4_MXFP4, "
     "MXFP4_MARLIN, MXFP4_BATCHED_MARLIN, MXFP4_HUMMING, MXFP4_CPU, MXFP4_EMULATION, "
     "MXFP8_FLASHINFER_TRTLLM, MXFP8_DEEPGEMM, MXFP8_MARLIN, MXFP8_XPU, MXFP8_AITER_MXFP8, MXFP8_HUMMING, "
     "MXFP8_TRITON_MXFP8, MXFP8_EMULATION)"),
    (W4A4, _build("MARLIN", False),
     f"W4A4 checkpoint routed to MARLIN {ON}, which never reads activation scales: its calibrated input_scale is "
     "discarded and activations run unquantized"),
])
def test_every_layer_problem_word_for_word(matrix, ck, build, message):
    assert _layer(matrix, ck, build).problem == message


def test_a_bf16_expectation_built_as_an_nvfp4_layer_names_the_consequence(matrix):
    """Every (expected, built) pair a layer can show has its consequence stated (a weight-only or W4A4 layer for
    an unquantized expectation included)."""
    case = case_for(matrix, WO, "layer_dispatch")
    ck = dataclasses.replace(case.cell.checkpoint, expect={**case.cell.checkpoint.expect,
                                                            "resolves_to": "unquantized"})
    bf16 = dataclasses.replace(case, cell=dataclasses.replace(case.cell, checkpoint=ck))
    assert dispatch.layer_verdict(bf16, _build("VLLM_CUTLASS", False), matrix.moe_backends).problem == (
        f"unquantized checkpoint built as W4A4 NVFP4 MoE (ModelOptNvFp4FusedMoE, backend VLLM_CUTLASS) {ON}: "
        f"{BF16_ON_NVFP4}")


# ----------------------------------------------------------------------------------------- kernel verdict


def _kernel(matrix, ck: str, build: LayerBuild, kf: KernelFormat | None):
    return kernel.kernel_verdict(case_for(matrix, ck, "kernel_format"), build, matrix.moe_backends, kf)


KON = f"{W4A4}@sm121-default kernel_format: backend VLLM_CUTLASS {ON}"
WON = f"{WO}@sm121-default kernel_format: backend MARLIN {ON}"


def test_kernel_verdict_records_the_quant_config_and_the_scales_kept(matrix):
    v = _kernel(matrix, W4A4, _build("VLLM_CUTLASS", False), KernelFormat(None, "Q", GOOD, ("a1_gscale", "a2_gscale")))
    assert v.problem is None and v.properties == ((P.QUANT_CONFIG, "Q"), (P.ACTIVATION_SCALES_KEPT,
                                                                          "a1_gscale,a2_gscale"))
    none = _kernel(matrix, WO, _build("MARLIN", True), KernelFormat(None, None))
    assert none.properties == ((P.QUANT_CONFIG, ""), (P.ACTIVATION_SCALES_KEPT, ""))
    marlin = _kernel(matrix, WO, _build("MARLIN", True), KernelFormat(None, "Q", GOOD, marlin_scales=("w13_scales",)))
    assert marlin.problem is None and (P.MARLIN_SCALES, "w13_scales") in marlin.properties


@pytest.mark.parametrize(("ck", "build", "kf", "message"), [
    (WO, _build("MARLIN", True), KernelFormat(None, None),
     f"{WON}: vLLM built no fused-MoE quant config after conversion, so nothing says what the kernel reads"),
    (WO, _build("NEW", True), KernelFormat(None, "Q", GOOD),
     f"{WO}@sm121-default kernel_format: backend NEW {ON}: backend NEW is not described under moe_backends"),
    (WO, _build("MARLIN", True), KernelFormat(None, "Q", {}),
     f"{WON}: the quant config Q holds no g1_alphas, g2_alphas: the dequant alphas are gone"),
    (WO, _build("MARLIN", True), KernelFormat(None, "Q", {"g1_alphas": False, "g2_alphas": False}),
     f"{WON}: g1_alphas, g2_alphas hold non-finite values after kernel-format conversion: every expert output "
     "through them is NaN or inf"),
    (WO, _build("MARLIN", True), KernelFormat(None, "Q", GOOD, ("a1_gscale", "a2_gscale")),
     f"{WON}: weight-only checkpoint, yet the kernel format carries activation scales (a1_gscale, a2_gscale): a W4A4 "
     "kernel would quantize activations with scales the checkpoint never had"),
    (WO, _build("MARLIN", True), KernelFormat(None, "Q", GOOD, marlin_scales=("w13_scales", "w2_scales"),
                                              marlin_wrong=("w2_scales expert 3 (1 of 4): x",)),
     f"{WON}: read back through Marlin's scale layout (adapter.marlin_layout), the converted scales are not the "
     "loaded ones: w2_scales expert 3 (1 of 4): x"),
    (W4A4, _build("VLLM_CUTLASS", False), KernelFormat(None, "Q", GOOD),
     f"{KON}: the checkpoint's calibrated activation scales were dropped (no a1_gscale/a2_gscale/a1_scale/a2_scale "
     "in the kernel format): activations run unquantized"),
])
def test_every_kernel_problem_word_for_word(matrix, ck, build, kf, message):
    assert _kernel(matrix, ck, build, kf).message == message


def test_kernel_verdict_skips_and_refusals_word_for_word(matrix):
    refused = LayerBuild(None, "ValueError: x")
    rejected = _kernel(matrix, REJECTED, refused, None)
    assert rejected.reason == "vLLM refuses this config, as the matrix expects: there is no layer to convert"
    assert rejected.problem is None and rejected.properties == ()
    built_but_unconverted = _kernel(matrix, WO, _build("MARLIN", True), None)
    assert built_but_unconverted.problem == "vLLM refused to build the MoE layer: None"
    cuda = _kernel(matrix, WO, _build("MARLIN", True), KernelFormat("needs CUDA"))
    assert (cuda.reason, cuda.problem, cuda.properties) == ("needs CUDA", None, ())


def test_kernel_activation_scales_default_to_any_when_the_matrix_is_silent(matrix):
    """A checkpoint and scheme that state no activation_scales leave the question to the backend's read-set: scales
    kept pass under a backend that reads input_scale, dropped pass under one that does not, and the opposite fail
    naming the read-set."""
    case = case_for(matrix, W4A4, "kernel_format")
    ck = case.cell.checkpoint
    scheme = dataclasses.replace(ck.scheme, expect={k: v for k, v in ck.scheme.expect.items()
                                                    if k != "activation_scales"})
    silent = dataclasses.replace(case, cell=dataclasses.replace(case.cell, checkpoint=dataclasses.replace(
        ck, scheme=scheme, expect={k: v for k, v in ck.expect.items() if k != "activation_scales"})))
    for backend, kept, ok in (("VLLM_CUTLASS", ("a1_gscale",), True), ("MARLIN", (), True),
                              ("VLLM_CUTLASS", (), False), ("MARLIN", ("a1_gscale",), False)):
        v = kernel.kernel_verdict(silent, _build(backend, False), matrix.moe_backends,
                                  KernelFormat(None, "Q", GOOD, kept))
        assert (v.problem is None) == ok and (ok or "read-set (quantmatrix/data/backends.yaml)" in v.problem)


def test_every_pinned_backend_is_named(matrix):
    case = case_for(matrix, W4A4, "layer_dispatch")
    ck = dataclasses.replace(case.cell.checkpoint, expect={**case.cell.checkpoint.expect, "moe_backend": PerArch(
        {"*": ["FLASHINFER_CUTLASS", "FLASHINFER_TRTLLM"]})})
    pinned = dataclasses.replace(case, cell=dataclasses.replace(case.cell, checkpoint=ck))
    assert dispatch.layer_verdict(pinned, _build("VLLM_CUTLASS", False), matrix.moe_backends).problem == (
        f"MoE backend VLLM_CUTLASS selected {ON}; the matrix pins FLASHINFER_CUTLASS, FLASHINFER_TRTLLM for this arch")
    assert dispatch.layer_verdict(pinned, _build("FLASHINFER_TRTLLM", False), matrix.moe_backends).problem is None
