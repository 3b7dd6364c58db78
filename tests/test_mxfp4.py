"""The MXFP4 factory against the code it imitates: its decoder (written from the spec) against vLLM's E2M1 unpacking
and E8M0 descale for every code and scale byte, its quantizer against the OCP rounding rules, the gpt-oss layout
vLLM's loader reads, and the lint's findings on hand-broken exports."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
import torch

from quantmatrix.adapter import families
from quantmatrix.adapter import mxfp4 as vllm_mxfp4
from quantmatrix.adapter.declared import declare
from quantmatrix.checkpoints import lint, store
from quantmatrix.checkpoints.schemes import mxfp4
from quantmatrix.schema.backends import package_backends
from quantmatrix.schema.synthetic import SyntheticSpec

ROOT = Path(__file__).resolve().parent.parent


def test_the_factory_decoder_is_vllms_for_every_code_and_scale():
    """Every byte of packed codes (both nibbles) under every E8M0 scale byte whose values bf16 holds (1..252): one row
    per scale byte, its 16 blocks holding the 256 bytes once."""
    scales = torch.arange(1, 253, dtype=torch.uint8).reshape(-1, 1).expand(-1, 16).contiguous()  # [252, 16]
    blocks = torch.arange(256, dtype=torch.uint8).reshape(16, 16).expand(len(scales), -1, -1).contiguous()
    ours = mxfp4.dequantize(blocks, scales, torch.bfloat16)
    assert ours.shape == (252, 512) and torch.equal(ours, vllm_mxfp4.dequantize_mxfp4(blocks, scales))
    assert ours.float().abs().max().item() == 6 * 2.0**125


def test_quantize_rounds_as_the_ocp_spec_says():
    """Exact grid values survive; ties go to the even code; the scale comes from the block's amax (rounded to two
    mantissa bits) less E2M1's top exponent; the low nibble holds the even input."""
    grid = torch.tensor([[0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -6] + [0] * 22])
    b, s = mxfp4.quantize(grid)
    assert s.tolist() == [[127]] and torch.equal(mxfp4.dequantize(b, s, torch.float32), grid)
    assert b[0, 0, 0].item() == 0x10  # 0.0 low, 0.5 high
    ties = torch.tensor([[4.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] + [0] * 24])
    b, s = mxfp4.quantize(ties)
    assert mxfp4.dequantize(b, s, torch.float32)[0, :8].tolist() == [4, 0, 1, 1, 2, 2, 4, 4]
    b, s = mxfp4.quantize(torch.full((1, 32), 100.0))  # 100 -> 2**6 -> scale 2**4, 100/16 = 6.25 saturates at 6
    assert s.tolist() == [[131]] and mxfp4.dequantize(b, s, torch.float32).unique().tolist() == [96.0]


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    out = tmp_path_factory.mktemp("gptoss")
    store.write(SyntheticSpec("mxfp4", "mxfp4", model="gpt_oss"), out)
    return out


def test_the_export_is_gpt_oss_s_layout(healthy):
    """quant_method mxfp4 (declared as MXFP4), blocks [E, out, in/32, 16] and scales [E, out, in/32] per fused
    projection, bf16 biases beside them, and the clean decode equals dequantized/'s bf16 model."""
    from safetensors.torch import load_file

    qc = json.loads((healthy / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "mxfp4" and declare(qc).family == "mxfp4"
    t = load_file(healthy / "model.safetensors")
    e = "model.layers.1.mlp.experts"
    assert t[f"{e}.gate_up_proj_blocks"].shape == (4, 128, 2, 16) and t[f"{e}.gate_up_proj_scales"].shape == (4, 128, 2)
    assert t[f"{e}.down_proj_blocks"].shape == (4, 64, 2, 16) and t[f"{e}.gate_up_proj_bias"].dtype == torch.bfloat16
    clean = load_file(healthy / store.DEQUANTIZED / "model.safetensors")
    decoded = vllm_mxfp4.dequantize_mxfp4(t[f"{e}.down_proj_blocks"], t[f"{e}.down_proj_scales"]).transpose(-1, -2)
    assert torch.equal(decoded, clean[f"{e}.down_proj"])
    assert not lint.lint(healthy, block_scales=True).findings


def test_the_lint_names_a_short_grid_and_out_of_range_scales(tmp_path):
    spec = SyntheticSpec("mxfp4", "mxfp4", model="gpt_oss", corrupt_tensors=(
        ("model.layers.0.mlp.experts.down_proj_scales", "shape"),
        ("model.layers.1.mlp.experts.gate_up_proj_scales", "nan")))
    store.write(spec, tmp_path)
    found = {(f.code, f.name) for f in lint.lint(tmp_path, block_scales=True).findings}
    assert found == {("bad_shape", "model.layers.0.mlp.experts.down_proj_scales"),
                     ("bad_value", "model.layers.1.mlp.experts.gate_up_proj_scales")}


def test_mxfp4_is_gpt_oss_only():
    assert "no mxfp4 layout" in SyntheticSpec("mxfp4", "mxfp4").problem()
    assert SyntheticSpec("none", "bf16", model="gpt_oss").problem() is None


def _dequant_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, cache: Path,
                 *plugins: str) -> pytest.RunResult:
    """The cpu tier's MXFP4 dequant_logits cases (sm121: the healthy export; the malformed ones are not decoded),
    in a child pytest."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src"),
                                                      os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(cache))
    return pytester.runpytest_subprocess(str(ROOT / "suites" / "test_checkpoints.py"), f"--rootdir={ROOT}",
                                         "-p", "no:cacheprovider", *plugins, "-m", "sm121 and default",
                                         "-k", "gptoss and dequant_logits", "-rA")


def test_mxfp4_scales_read_transposed_turn_the_cpu_tier_red(pytester, monkeypatch, tmp_path_factory):
    """vLLM with its E8M0 scale grid read transposed (tests/mxfp4_bug.py): dequant_logits fails on the healthy
    export, naming the logit error; unchanged vLLM passes the same cases."""
    cache = tmp_path_factory.mktemp("qm-cache")
    clean = _dequant_run(pytester, monkeypatch, cache)
    assert clean.parseoutcomes() == {"passed": 1, "deselected": clean.parseoutcomes().get("deselected")}, \
        clean.outlines[-20:]
    buggy = _dequant_run(pytester, monkeypatch, cache, "-p", "mxfp4_bug")
    failed = [line.split(" - ")[0] for line in buggy.outlines if line.startswith("FAILED")]
    assert len(failed) == 1 and failed[0].endswith("::test_dequant_logits[gptoss-tiny-mxfp4@sm121-default]"), \
        buggy.outlines[-20:]
    buggy.stdout.fnmatch_lines(["*dequantized model strays from bf16: logit relative error*"])


@pytest.mark.parametrize(("backend", "weight_only"), [("MARLIN", True), ("FLASHINFER_TRTLLM_MXFP4_BF16", True),
                                                      ("FLASHINFER_TRTLLM_MXFP4_MXFP8", False),
                                                      ("CUTLASS_MXFP4_MXFP4", False)])
def test_the_mxfp4_method_reads_as_its_backend_s_read_set(backend, weight_only):
    """GptOssMxfp4MoEMethod's backend enum names an MXFP4_* read-set the package describes; the MXFP8 / MXFP4
    activation backends quantize activations themselves (not weight-only), the others run them bf16."""
    method = type("GptOssMxfp4MoEMethod", (), {"mxfp4_backend": types.SimpleNamespace(value=backend)})()
    reading = families.read(method, lambda m: True)
    assert reading == families.Reading("mxfp4", f"MXFP4_{backend}", weight_only)
    names = families.read_sets("mxfp4", package_backends())
    assert reading.backend in names and all(n.startswith("MXFP4_") for n in names) and len(names) == 11
    assert package_backends()[reading.backend].reads == {"weight", "block_scale"}
