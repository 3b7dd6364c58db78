"""The checkpoint lint: clean exports pass, each malformed variant is reported precisely (module, expert,
tensor, why), and only headers and per-tensor scales are read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantmatrix import cli
from quantmatrix.checkpoints import lint, store
from quantmatrix.schema.synthetic import SyntheticSpec


def build(tmp_path: Path, name: str, **fields) -> Path:
    out = tmp_path / name
    out.mkdir()
    store.write(SyntheticSpec(**fields), out)
    return out


@pytest.mark.parametrize("fields", [
    dict(producer="none", scheme="bf16", model="mixtral"),
    dict(producer="modelopt", scheme="nvfp4_w4a4"),
    dict(producer="modelopt", scheme="nvfp4_w4a4", form="legacy"),
    dict(producer="modelopt", scheme="nvfp4_weight_only", input_activations="null"),
    dict(producer="modelopt", scheme="nvfp4_weight_only", quant_algo="W4A16_NVFP4", input_activations="missing"),
    dict(producer="modelopt", scheme="nvfp4_w4a4", quantize="experts_attention", model="mixtral"),
    dict(producer="compressed-tensors", scheme="nvfp4_w4a4", quantize="experts_attention"),
    dict(producer="compressed-tensors", scheme="nvfp4_weight_only", input_activations="empty"),
    dict(producer="modelopt", scheme="nvfp4_w4a4", size="gpu_tiny", model="mixtral"),
], ids=lambda f: "-".join(str(v) for v in f.values()))
def test_sound_exports_are_clean(tmp_path, fields):
    """Every well-formed export agrees with its own config, including block-scale values."""
    report = lint.lint(build(tmp_path, "ck", **fields), block_scales=True)
    assert report.findings == [], report.render()
    assert report.declared.scheme == {"bf16": "unquantized", "nvfp4_w4a4": "w4a4",
                                      "nvfp4_weight_only": "weight_only"}[fields["scheme"]]


def test_one_expert_missing_its_input_scale(tmp_path):
    """Leaving out layer 1 expert 3's input_scale gives exactly its three projections, each naming module,
    layer, expert and tensor, and why vLLM's W4A4 kernel needs it."""
    ck = build(tmp_path, "ck", producer="modelopt", scheme="nvfp4_w4a4",
               omit_tensors=("model.layers.1.mlp.experts.3.*.input_scale",))
    report = lint.lint(ck)
    assert [(f.code, f.module, f.tensor, f.layer_expert) for f in report.findings] == [
        ("missing_tensor", f"model.layers.1.mlp.experts.3.{p}", "input_scale", (1, 3))
        for p in ("down_proj", "gate_proj", "up_proj")]
    text = report.render()
    assert "model.layers.1.mlp.experts.3.gate_proj [layer 1, expert 3] input_scale: missing; the config " \
           "declares W4A4 (config.json quant_algo NVFP4, group_0 input_activations quantized)" in text
    assert "FAIL: 3 finding(s) (missing_tensor 3)" in text


def test_w4a4_config_without_input_scales(tmp_path):
    """A W4A4 config whose files hold no input_scale is reported for every quantized module (24)."""
    report = lint.lint(build(tmp_path, "ck", producer="compressed-tensors", scheme="nvfp4_w4a4",
                             input_scales="absent"))
    assert {f.tensor for f in report.findings} == {"input_global_scale"} and len(report.findings) == 24


def test_weight_only_config_with_input_scales(tmp_path):
    """A weight-only config (input_activations null) whose files carry input_scale: every module flagged."""
    report = lint.lint(build(tmp_path, "ck", producer="modelopt", scheme="nvfp4_weight_only",
                             input_activations="null", input_scales="present"))
    assert report.codes() == {"unexpected_tensor"} and len(report.findings) == 24
    assert "discards it" in report.findings[0].message


def test_bad_values_and_shapes(tmp_path):
    """zero / inf scalar scales and NaN block scales are bad_value (block scales only with block_scales);
    a short block-scale row and a two-element scalar are bad_shape."""
    m = "model.layers.0.mlp.experts"
    ck = build(tmp_path, "ck", producer="modelopt", scheme="nvfp4_w4a4", corrupt_tensors=(
        (f"{m}.0.down_proj.weight_scale_2", "zero"), (f"{m}.1.down_proj.input_scale", "inf"),
        (f"{m}.2.down_proj.weight_scale", "nan"), (f"{m}.3.down_proj.weight_scale", "shape"),
        (f"{m}.3.gate_proj.input_scale", "shape")))
    got = {(f.code, f.module.rpartition("experts.")[2], f.tensor) for f in lint.lint(ck, block_scales=True).findings}
    assert got == {("bad_value", "0.down_proj", "weight_scale_2"), ("bad_value", "1.down_proj", "input_scale"),
                   ("bad_value", "2.down_proj", "weight_scale"), ("bad_shape", "3.down_proj", "weight_scale"),
                   ("bad_shape", "3.gate_proj", "input_scale")}
    assert "bad_value" not in {f.code for f in lint.lint(ck).findings if f.tensor == "weight_scale"}


def test_ignored_module_holding_nvfp4_tensors_and_unquantized_linear(tmp_path):
    """A module matched by `ignore` that holds NVFP4 tensors, and a Linear neither ignored nor quantized,
    are both reported."""
    ck = build(tmp_path, "ck", producer="modelopt", scheme="nvfp4_w4a4")
    cfg = json.loads((ck / "config.json").read_text())
    cfg["quantization_config"]["ignore"] = ["lm_head", "model.layers.*.mlp.gate", "model.layers.0.mlp.experts.0*"]
    (ck / "config.json").write_text(json.dumps(cfg))
    report = lint.lint(ck)
    assert {(f.code, f.module) for f in report.findings} == (
        {("quantized_but_ignored", f"model.layers.0.mlp.experts.0.{p}") for p in ("gate_proj", "up_proj", "down_proj")}
        | {("unquantized", f"model.layers.{layer}.self_attn.{p}") for layer in (0, 1)
           for p in ("q_proj", "k_proj", "v_proj", "o_proj")})


def test_groups_that_disagree_and_a_missing_expert(tmp_path):
    """Config groups disagreeing on input_activations is a config finding; an expert with no tensors at all
    (fewer experts than config.json says) is missing_tensor per projection."""
    ck = build(tmp_path, "ck", producer="modelopt", scheme="nvfp4_w4a4",
               omit_tensors=("model.layers.0.mlp.experts.2.*",))
    cfg = json.loads((ck / "config.json").read_text())
    groups = cfg["quantization_config"]["config_groups"]
    groups["group_1"] = dict(groups["group_0"], input_activations=None)
    (ck / "config.json").write_text(json.dumps(cfg))
    report = lint.lint(ck)
    assert ("config", "config.json") in {(f.code, f.module) for f in report.findings}
    assert {f.module for f in report.findings if f.code == "missing_tensor"} == {
        f"model.layers.0.mlp.experts.2.{p}" for p in ("gate_proj", "up_proj", "down_proj")}


def test_reads_headers_and_scalar_scales_only(tmp_path, monkeypatch):
    """Without block_scales the lint reads no tensor data but the per-tensor F32 scales; it never reads a
    weight."""
    ck = build(tmp_path, "ck", producer="modelopt", scheme="nvfp4_w4a4")
    read: list[str] = []
    real = lint._read
    monkeypatch.setattr(lint, "_read", lambda t, n: read.append(t.name) or real(t, n))
    lint.lint(ck)
    assert read and all(n.endswith((".weight_scale_2", ".input_scale")) for n in read)


def test_main_exit_codes(tmp_path, capsys):
    """`quantmatrix lint DIR`: 0 and OK when clean, 1 with the findings (or JSON), 2 when DIR has no config."""
    clean = build(tmp_path, "clean", producer="compressed-tensors", scheme="nvfp4_weight_only")
    assert cli.main(["lint", str(clean)]) == 0 and "OK:" in capsys.readouterr().out
    bad = build(tmp_path, "bad", producer="compressed-tensors", scheme="nvfp4_weight_only", input_scales="present")
    assert cli.main(["lint", str(bad), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["declared"]["scheme"] == "weight_only" and out["findings"][0]["code"] == "unexpected_tensor"
    assert cli.main(["lint", str(tmp_path)]) == 2 and "cannot read config.json" in capsys.readouterr().err


MALFORMED = """\
version: 1
archs: [{name: sm121, capability: "12.1", label: GB10}]
modes: [{name: eager, label: eager}]
schemes:
  - {name: nvfp4_w4a4, marker: w4a4, label: W4A4, factory: nvfp4_w4a4, expect: {resolves_to: w4a4, lint: []}}
checks:
  - {name: checkpoint_lint, kind: lint, tier: cpu, description: lint}
  - {name: hf_reference, kind: reference, tier: cpu, description: deselected here}
  - {name: dequant_logits, kind: quantizer, tier: cpu, description: deselected here}
checkpoints:
  - id: no-input-scales
    source: {synthetic: {model: qwen3_moe, input_scales: absent}}
    producer: modelopt
    scheme: nvfp4_w4a4
    expect: {lint: [missing_tensor]}
  - id: expert-hole
    source: {synthetic: {model: qwen3_moe, omit_tensors: ["model.layers.0.mlp.experts.3.*.input_scale"]}}
    producer: modelopt
    scheme: nvfp4_w4a4
    expect: {lint: [missing_tensor]}
  - id: bad-values
    source:
      synthetic:
        model: qwen3_moe
        corrupt_tensors: {"model.layers.0.mlp.experts.1.down_proj.input_scale": inf,
                          "model.layers.1.mlp.experts.2.up_proj.weight_scale": nan}
    producer: modelopt
    scheme: nvfp4_w4a4
    expect: {lint: [bad_value]}
  - id: bad-shapes
    source: {synthetic: {model: qwen3_moe, corrupt_tensors: {"*.experts.0.down_proj.weight_scale": shape}}}
    producer: compressed-tensors
    scheme: nvfp4_w4a4
    expect: {lint: [bad_shape]}
  - id: hole-not-declared
    label: the matrix forgot to say this one is malformed - the check must fail it
    source: {synthetic: {model: qwen3_moe, omit_tensors: ["model.layers.1.mlp.experts.0.gate_proj.input_scale"]}}
    producer: modelopt
    scheme: nvfp4_w4a4
  - id: sound-but-expected-broken
    label: a sound export the matrix claims is broken - the check must fail it too
    source: {synthetic: {model: qwen3_moe}}
    producer: compressed-tensors
    scheme: nvfp4_w4a4
    expect: {lint: [bad_value]}
"""


def test_lint_check_passes_and_fails_exactly_as_expect_lint_says(pytester, monkeypatch, tmp_path):
    """Through the real suite: each malformed variant passes when `expect.lint` names its findings; an
    undeclared hole and a sound export claimed broken both fail, with the lint's report in the output."""
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path / "cache"))
    pytester.makefile(".yaml", m=MALFORMED)
    suite = Path(__file__).parents[1] / "suites" / "test_checkpoints.py"
    pytester.makepyfile(test_checkpoints=suite.read_text())
    result = pytester.runpytest("--matrix", "m.yaml", "-p", "no:cacheprovider", "-rf", "-k", "checkpoint_lint")
    result.assert_outcomes(passed=4, failed=2)
    result.stdout.fnmatch_lines(["FAILED *test_checkpoint_lint[[]hole-not-declared@sm121-eager]*",
                                 "FAILED *test_checkpoint_lint[[]sound-but-expected-broken@sm121-eager]*"])
    result.stdout.fnmatch_lines(["hole-not-declared@sm121-* checkpoint_lint: unexpected findings [[]'missing_tensor']",
                                 "*model.layers.1.mlp.experts.0.gate_proj [[]layer 1, expert 0] input_scale: "
                                 "missing*"])
    result.stdout.fnmatch_lines(["sound-but-expected-broken@sm121-* checkpoint_lint: expected findings [[]'bad_value'] "
                                 "did not appear"])
