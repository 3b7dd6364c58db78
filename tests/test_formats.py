"""W8A8 INT8 and W4A8 FP8 (compressed-tensors) against the code they imitate: the factory's int8 scales and codes
against the compressed-tensors package's own qparams and quantize, the W4AFP8 export unpacked by the package, each
config read by adapter.declared as vLLM's real resolution reads it (with the one disagreement pinned), the lint's
INT8 module check on the tensors vLLM's INT8 MoE has no parameter for, and the group size vLLM 0.32's W4A8 MoE
method refuses, which the matrix's g64 checkpoint is labelled with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from quantmatrix.adapter import config, declared
from quantmatrix.checkpoints import configs, lint, lint_int8
from quantmatrix.checkpoints.lint import Tensor
from quantmatrix.checkpoints.producers import compressed_tensors
from quantmatrix.checkpoints.schemes import int8, wna16
from quantmatrix.checkpoints.untrusted import LintError
from quantmatrix.schema.synthetic import SyntheticSpec

MODEL = configs.model_config("qwen3_moe", "cpu_tiny")


def _weight(rows: int = 16, cols: int = 256) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    w = torch.randn(rows, cols, generator=g) / 8
    w[3] = 0  # an all-zero row takes scale 1.0
    return w.to(torch.bfloat16)


def _qc(scheme: str) -> dict[str, Any]:
    return compressed_tensors.quantization_config(SyntheticSpec("compressed-tensors", scheme))


def test_int8_scales_and_codes_are_the_packages():
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    w = _weight()
    args = QuantizationArgs(**_qc("w8a8_int8")["config_groups"]["group_0"]["weights"])
    amax = w.float().abs().amax(dim=1, keepdim=True)
    scale, zero = calculate_qparams(-amax, amax, args)
    ours = int8.weight_scale(w)
    nonzero = amax.squeeze(1) > 0
    assert torch.allclose(ours[nonzero], scale.float()[nonzero], rtol=1e-6)
    stored = ours.to(torch.bfloat16)
    assert torch.equal(int8.quantize(w, stored), quantize(w.float(), stored.float(), zero, args, dtype=torch.int8))
    assert int8.quantize(w, stored)[3].abs().max() == 0


def test_w4afp8_weights_unpack_with_the_package():
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    spec = SyntheticSpec("compressed-tensors", "w4a8_fp8_g128")
    q = wna16.quantize(_weight(), 4, 128, symmetric=True)
    out = compressed_tensors.RECIPES["w4a8"].tensors(q, spec)
    assert torch.equal(unpack_from_int32(out["weight"], 4, torch.Size(q.codes.shape)).to(torch.int32) + 8, q.codes)
    assert tuple(out["block_scale"].shape) == (16, 2) and out["weight_shape"].tolist() == [16, 256]


def _checkpoint(d: Path, qc: dict[str, Any]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(MODEL | {"quantization_config": qc}))
    return d


def _acts_empty(scheme: str) -> dict[str, Any]:
    qc = _qc(scheme)
    qc["config_groups"]["group_0"]["input_activations"] = {}
    return qc


AGREE = [("w8a8-int8", _qc("w8a8_int8"), "w8a8_int8"), ("w4afp8-g128", _qc("w4a8_fp8_g128"), "w4a8_fp8"),
         ("w4afp8-g64", _qc("w4a8_fp8_g64"), "w4a8_fp8"),
         ("w4afp8-acts-empty", _acts_empty("w4a8_fp8_g128"), "weight_only")]


@pytest.mark.parametrize(("qc", "scheme"), [a[1:] for a in AGREE], ids=[a[0] for a in AGREE])
def test_the_classifier_reads_each_config_as_vllm_resolves_it(tmp_path, qc, scheme):
    d = _checkpoint(tmp_path, qc)
    assert config.resolve(d).scheme == scheme
    assert declared.declare(qc).scheme == scheme
    assert declared.of_model(config.model_config(d)).scheme == scheme
    assert lint.declared(d)[0].scheme == scheme


def test_w4afp8_as_int_quantized_resolves_but_the_lint_refuses_it(tmp_path):
    """compressed-tensors 0.17 infers `int-quantized` for the W4AFP8 preset (unpacked int8 `weight`); vLLM's config
    resolution does not look at the format, but its W4A8 MoE method registers only `weight_packed`, so such an
    export would not load. The lint names the format rather than guess a layout."""
    qc = _qc("w4a8_fp8_g128") | {"format": "int-quantized"}
    d = _checkpoint(tmp_path, qc)
    assert config.resolve(d).scheme == "w4a8_fp8"
    assert declared.declare(qc).scheme is None
    with pytest.raises(LintError, match="int-quantized"):
        lint.declared(d)


def test_vllm_refuses_w4a8_groups_of_64_when_it_builds_the_moe_method():
    """Config resolution accepts W4AFP8 with groups of 64 (the matrix's g64 checkpoint resolves to w4a8_fp8); vLLM
    0.32's MoE method asserts 128 before it selects a backend."""
    from compressed_tensors.quantization import QuantizationArgs, preset_name_to_scheme
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_w4a8_fp8 as w4a8_moe,
    )

    scheme = preset_name_to_scheme("W4AFP8", ["Linear"])
    method = w4a8_moe.CompressedTensorsW4A8Fp8MoEMethod
    weights = QuantizationArgs(**scheme.weights.model_dump() | {"group_size": 64})
    with pytest.raises(AssertionError, match="Only group size 128"):
        method.__init__(method.__new__(method), weights, scheme.input_activations, None)


def test_int8_module_check_names_what_vllm_has_no_parameter_for(tmp_path):
    def t(name: str, dtype: str, shape: tuple[int, ...]) -> Tensor:
        return Tensor(name, dtype, shape, tmp_path / "x.safetensors", 0)

    leaves = {"weight": t("m.weight", "I8", (8, 64)), "weight_scale": t("m.weight_scale", "F32", (8,)),
              "input_scale": t("m.input_scale", "F32", (1,)), "weight_zero_point": t("m.weight_zero_point", "I8", (8,))}
    found = lint_int8.check_int8_module("m", leaves, "compressed-tensors", scale_values=False)
    assert [(f[0], f[2]) for f in found] == [("unexpected_tensor", "input_scale"),
                                             ("unexpected_tensor", "weight_zero_point")]
    wrong = {"weight": t("m.weight", "I32", (8, 16))}
    assert [(f[0], f[2]) for f in lint_int8.check_int8_module("m", wrong, "compressed-tensors", False)] == [
        ("missing_tensor", "weight_scale"), ("bad_dtype", "weight")]


def test_the_int8_reader_names_its_read_set_and_fails_loudly_without_the_enum():
    """CompressedTensorsW8A8Int8MoEMethod reads as w8a8_int8 with the INT8_<backend> read-set, which backends.yaml
    holds for every backend of the oracle; a method that lost `int8_backend` is an AdapterMismatch, not a guess."""
    from vllm.model_executor.layers.fused_moe.oracle.int8 import Int8MoeBackend

    from quantmatrix.adapter import families
    from quantmatrix.errors import AdapterMismatch
    from quantmatrix.schema.backends import merged

    method = type("CompressedTensorsW8A8Int8MoEMethod", (), {"int8_backend": Int8MoeBackend.TRITON})()
    reading = families.read(method, lambda m: False)
    assert (reading.scheme, reading.backend, reading.weight_only) == ("w8a8_int8", "INT8_TRITON", False)
    backends = merged({})
    assert families.read_sets("w8a8_int8", backends) == [f"INT8_{b.value}" for b in Int8MoeBackend]
    assert all(backends[f"INT8_{b.value}"].reads == {"weight", "block_scale"} for b in Int8MoeBackend)
    with pytest.raises(AdapterMismatch, match="int8_backend"):
        families.read(type("CompressedTensorsW8A8Int8MoEMethod", (), {})(), lambda m: False)


@pytest.mark.parametrize("scheme", ["w8a8_int8", "w4a8_fp8_g128"])
def test_the_check_decodes_what_the_factory_encoded(scheme, tmp_path):
    """dequant_logits' decode of the stored tensors (W4A8 through vLLM's unpacking and the producer's SHAPES and
    PACKING rows, W8A8 as code * scale) is exactly the bf16 weight the factory's reference arithmetic gives."""
    from quantmatrix.checkpoints.lint import Declared
    from quantmatrix.measure import dequant

    spec = SyntheticSpec("compressed-tensors", scheme)
    w = _weight()
    if scheme == "w8a8_int8":
        scale = int8.weight_scale(w).to(torch.bfloat16)
        tensors = {"m.weight": int8.quantize(w, scale), "m.weight_scale": scale}
        d = Declared("compressed-tensors", "w8a8_int8", "", (), declared.IntWeights(8, -1, False, True), "int8")
        assert torch.equal(dequant._int8_state(tmp_path, d, tensors)["m.weight"],
                           int8.dequantize(tensors["m.weight"], scale))
        return
    q = wna16.quantize(w, 4, 128, symmetric=True)
    names = compressed_tensors.LEAVES["w4a8"]
    tensors = {f"m.{names[r]}": t for r, t in compressed_tensors.RECIPES["w4a8"].tensors(q, spec).items()}
    d = Declared("compressed-tensors", "w4a8_fp8", "", (), declared.IntWeights(4, 128, False, True), "w4a8")
    assert torch.equal(dequant._wna16_state(tmp_path, d, tensors)["m.weight"], wna16.dequantize(q, torch.bfloat16))
