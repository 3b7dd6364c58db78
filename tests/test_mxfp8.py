"""The MXFP8 factory against the code it imitates: its decoder (written from the spec) against vLLM's
dequant_mxfp8_to_bf16 for every E4M3 code and scale byte, ModelOpt's quantizer against vLLM's reference one, the
ModelOpt export vLLM resolves to ModelOptMxFp8Config (both config forms), and the lint's findings on hand-broken
exports."""

from __future__ import annotations

import importlib
import json
import types

import pytest
import torch

from quantmatrix.adapter import config as vllm_config
from quantmatrix.adapter import families
from quantmatrix.adapter import mxfp4 as vllm_mx
from quantmatrix.adapter.declared import declare
from quantmatrix.checkpoints import lint, lint_mxfp4, store
from quantmatrix.checkpoints.producers import modelopt
from quantmatrix.checkpoints.schemes import mxfp8
from quantmatrix.errors import AdapterMismatch
from quantmatrix.measure import dequant
from quantmatrix.schema.backends import package_backends
from quantmatrix.schema.synthetic import SyntheticSpec


def test_the_factory_decoder_is_vllms_for_every_code_and_scale():
    """Every E4M3 byte (NaN codes too) under every E8M0 byte whose 448 x 2**(b - 127) bf16 holds (0..246)."""
    scales = torch.arange(0, 247, dtype=torch.uint8).reshape(-1, 1).expand(-1, 8).contiguous()  # [247, 8]
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).expand(len(scales), -1).contiguous()
    ours = mxfp8.dequantize(codes, scales)
    torch.testing.assert_close(ours, vllm_mx.dequantize_mxfp8(codes, scales), rtol=0, atol=0, equal_nan=True)
    assert ours[-1].float().nan_to_num().abs().max().item() == 448 * 2.0**119 and ours.isnan().sum() == 2 * 247


def test_modelopt_quantizes_as_vllms_reference_quantizer():
    """The producer's recipe gives vLLM's _mxfp8_e4m3_quantize_torch bytes, exact on a grid block, and its scale
    is the smallest power of two bringing the block's amax within 448."""
    reference = importlib.import_module("vllm.model_executor.layers.quantization.utils.mxfp8_utils")
    w = torch.randn(3, 16, 96, dtype=torch.bfloat16) * torch.logspace(-6, 3, 16).reshape(1, 16, 1)
    q, s = modelopt.RECIPES["mxfp8"].quantize(w)
    rq, rs = reference._mxfp8_e4m3_quantize_torch(w)
    assert torch.equal(s, rs) and torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
    _, s = modelopt.RECIPES["mxfp8"].quantize(torch.tensor([[448.0] * 32, [449.0] * 32, [1.0] * 32]))
    assert s.flatten().tolist() == [127, 128, 119]


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    out = tmp_path_factory.mktemp("mxfp8")
    store.write(SyntheticSpec("modelopt", "mxfp8"), out)
    return out


def test_the_export_is_modelopts_mxfp8_layout(healthy):
    """quant_algo MXFP8 (declared family mxfp8), F8_E4M3 weight [o, i] and U8 weight_scale [o, i/32] per expert
    Linear, no input_scale; vLLM's decode of the files equals dequantized/'s bf16 model; the lint finds nothing."""
    from safetensors.torch import load_file

    qc = json.loads((healthy / "config.json").read_text())["quantization_config"]
    assert qc["quant_algo"] == "MXFP8" and declare(qc).family == "mxfp8"
    t = load_file(healthy / "model.safetensors")
    m = "model.layers.1.mlp.experts.2.down_proj"
    assert t[f"{m}.weight"].dtype == torch.float8_e4m3fn and t[f"{m}.weight_scale"].dtype == torch.uint8
    assert t[f"{m}.weight_scale"].shape == (t[f"{m}.weight"].shape[0], t[f"{m}.weight"].shape[1] // 32)
    assert not any(n.endswith("input_scale") for n in t)
    clean = load_file(healthy / store.DEQUANTIZED / "model.safetensors")
    assert torch.equal(dequant.dequantized_state(healthy)[f"{m}.weight"], clean[f"{m}.weight"])
    assert not lint.lint(healthy, block_scales=True).findings


def test_vllm_resolves_config_json_to_modelopt_mxfp8_and_refuses_the_legacy_file(tmp_path):
    """config.json's form resolves to ModelOptMxFp8Config; vLLM 0.32 refuses hf_quant_config.json's (its ModelOpt
    normalisation knows the FP8 algos and NVFP4 only), though the file holds every key ModelOptMxFp8Config asks."""
    (tmp_path / "json").mkdir(), (tmp_path / "legacy").mkdir()
    store.write(SyntheticSpec("modelopt", "mxfp8"), tmp_path / "json")
    r = vllm_config.resolve(tmp_path / "json")
    assert (r.method, r.config_class, r.scheme) == ("modelopt_mxfp8", "ModelOptMxFp8Config", "mxfp8"), r
    store.write(SyntheticSpec("modelopt", "mxfp8", form="legacy"), tmp_path / "legacy")
    r = vllm_config.resolve(tmp_path / "legacy")
    assert r.scheme == "rejected" and "Unknown ModelOpt quant algo: MXFP8" in r.detail, r
    inner = json.loads((tmp_path / "legacy" / "hf_quant_config.json").read_text())["quantization"]
    assert {"kv_cache_quant_algo", "exclude_modules"} <= set(inner) and inner["quant_algo"] == "MXFP8"


def test_the_lint_names_a_short_grid_out_of_range_scales_and_a_stray_input_scale(tmp_path):
    spec = SyntheticSpec("modelopt", "mxfp8", corrupt_tensors=(
        ("model.layers.0.mlp.experts.2.down_proj.weight_scale", "shape"),
        ("model.layers.1.mlp.experts.1.gate_proj.weight_scale", "nan"),
        ("model.layers.1.mlp.experts.0.up_proj.weight_scale", "zero")))
    store.write(spec, tmp_path)
    found = {(f.code, f.name) for f in lint.lint(tmp_path, block_scales=True).findings}
    assert found == {("bad_shape", "model.layers.0.mlp.experts.2.down_proj.weight_scale"),
                     ("bad_value", "model.layers.1.mlp.experts.1.gate_proj.weight_scale"),
                     ("bad_value", "model.layers.1.mlp.experts.0.up_proj.weight_scale")}
    with pytest.raises(ValueError, match="no U8 E8M0 scale grid"):
        dequant.dequantized_state(tmp_path)


def test_e8m0_range_is_the_formats():
    """MXFP4's bad bytes are what they were (255, 253-254, 0); E4M3's 448 overflows bf16 from byte 247."""
    assert lint_mxfp4.e8m0_bad_bytes(lint_mxfp4.E2M1_MAX) == {255: "NaN", 253: "overflowing", 254: "overflowing",
                                                               0: "2**-127 (zeroed)"}
    assert sorted(lint_mxfp4.e8m0_bad_bytes(mxfp8.E4M3_MAX)) == [0, *range(247, 256)]


@pytest.mark.parametrize(("backend", "weight_only"), [("MARLIN", True), ("FLASHINFER_TRTLLM", False),
                                                      ("TRITON_MXFP8", False), ("EMULATION", False)])
def test_the_mxfp8_method_reads_as_its_backend_s_read_set(backend, weight_only):
    """ModelOptMxFp8FusedMoE's Fp8MoeBackend enum names an MXFP8_* read-set the package describes, reading the
    E4M3 weights and E8M0 scales only; Marlin (W8A16) runs activations bf16, the others quantize them."""
    method = type("ModelOptMxFp8FusedMoE", (), {"mxfp8_backend": types.SimpleNamespace(value=backend)})()
    reading = families.read(method, lambda m: True)
    assert reading == families.Reading("mxfp8", f"MXFP8_{backend}", weight_only)
    names = families.read_sets("mxfp8", package_backends())
    assert reading.backend in names and all(n.startswith("MXFP8_") for n in names) and len(names) == 8
    assert package_backends()[reading.backend].reads == {"weight", "block_scale"}
    with pytest.raises(AdapterMismatch, match="no mxfp8_backend"):
        families.read(type("ModelOptMxFp8FusedMoE", (), {})(), lambda m: True)
