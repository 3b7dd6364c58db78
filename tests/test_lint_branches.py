"""Every branch of the checkpoint lint and of its verdict, on hand-written safetensors files of a few bytes (no
factory, so each test takes milliseconds and bench/mutation.py can rerun them per mutant): the declaration read
as vLLM reads it, each finding word for word, and the per-tensor expectation that makes three planted
`bad_value`s three findings to show rather than one code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from quantmatrix.checkpoints import lint, producers
from quantmatrix.checkpoints.lint import Declared, Finding, LintError, LintReport
from quantmatrix.checks.checkpoint import lint_problem
from quantmatrix.schema.model import TensorFinding

E0 = "model.layers.0.mlp.experts.0"
NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4",
         "config_groups": {"g": {"input_activations": {"num_bits": 4}}}}
WEIGHT_ONLY = {**NVFP4, "config_groups": {"g": {"input_activations": None}}}
CT = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
      "config_groups": {"g": {"input_activations": {"num_bits": 4}}}}


def _module(prefix: str, *, producer: str = "modelopt", inputs: bool = True, scale_2: float = 0.5,
            input_scale: float = 0.25) -> dict[str, torch.Tensor]:
    """One NVFP4 Linear of 4 outputs x 32 inputs, as the producer names it."""
    names = producers.leaves(producer, lint.SCHEME)
    out = {f"{prefix}.{names['weight']}": torch.full((4, 16), 0x21, dtype=torch.uint8),
           f"{prefix}.{names['block_scale']}": torch.ones(4, 2).to(torch.float8_e4m3fn),
           f"{prefix}.{names['global_scale']}": torch.tensor(scale_2)}
    if inputs:
        out[f"{prefix}.{names['input_scale']}"] = torch.tensor(input_scale)
    return out


def _write(d: Path, qc: object, tensors: dict[str, torch.Tensor], experts: object = 1, **extra: object) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "qwen3_moe", **({"num_experts": experts} if experts is not None else {}), **extra}
    if qc is not None:
        cfg["quantization_config"] = qc
    (d / "config.json").write_text(json.dumps(cfg))
    if tensors:
        save_file(tensors, str(d / "model.safetensors"))
    return d


def _findings(d: Path) -> list[str]:
    return [f"{f.code} {f}" for f in lint.lint(d, block_scales=True).findings]


# ------------------------------------------------------------------------------------------- declaration


@pytest.mark.parametrize(("qc", "scheme", "why"), [
    (NVFP4, "w4a4", "config.json quant_algo NVFP4, g input_activations quantized"),
    (WEIGHT_ONLY, "weight_only", "config.json quant_algo NVFP4, g input_activations null"),
    ({**NVFP4, "config_groups": {"g": {}}}, "weight_only", "config.json quant_algo NVFP4, g input_activations missing"),
    ({**NVFP4, "config_groups": {"g": {"input_activations": {}}}}, "w4a4",
     "config.json quant_algo NVFP4, g input_activations empty"),
    # vLLM's promotion asks `isinstance(group, dict) and group.get("input_activations") is None`: a group that is not
    # a mapping says nothing, so the checkpoint stays W4A4 (this lint once read it as a missing key: weight-only)
    ({**NVFP4, "config_groups": {"g": 3}}, "w4a4", "config.json quant_algo NVFP4, g input_activations not-a-mapping"),
    ({**NVFP4, "config_groups": {}}, "w4a4", "config.json quant_algo NVFP4, config_groups empty"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "w4a4",
     "config.json quant_algo NVFP4, config_groups missing"),
    ({"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4"}, "weight_only",
     "config.json quant_algo W4A16_NVFP4, config_groups missing"),
    ({**CT, "config_groups": {"g": {"input_activations": {}}}}, "weight_only",
     "config.json format nvfp4-pack-quantized, g input_activations empty"),
    (CT, "w4a4", "config.json format nvfp4-pack-quantized, g input_activations quantized"),
    # compressed-tensors with no group quantizes no Linear (vLLM gives each UnquantizedLinearMethod)
    ({**CT, "config_groups": {}}, "unquantized", "config.json format nvfp4-pack-quantized, config_groups empty"),
    ({k: v for k, v in CT.items() if k != "config_groups"}, "unquantized",
     "config.json format nvfp4-pack-quantized, config_groups missing"),
    # what vLLM normalises: the method's case and spelling, the algo's case
    ({**WEIGHT_ONLY, "quant_method": "ModelOpt", "quant_algo": "nvfp4"}, "weight_only",
     "config.json quant_algo NVFP4, g input_activations null"),
    ({**CT, "quant_method": "compressed_tensors"}, "w4a4",
     "config.json format nvfp4-pack-quantized, g input_activations quantized"),
    # compressed-tensors asks whether input_activations is truthy; ModelOpt whether it is None
    ({**CT, "config_groups": {"g": {"input_activations": ""}}}, "weight_only",
     "config.json format nvfp4-pack-quantized, g input_activations unexpected str"),
    ({**NVFP4, "config_groups": {"g": {"input_activations": ""}}}, "w4a4",
     "config.json quant_algo NVFP4, g input_activations unexpected str"),
])
def test_declared_scheme_as_vllm_reads_it(tmp_path, qc, scheme, why):
    d, findings = lint.declared(_write(tmp_path, qc, {}))
    assert (d.scheme, d.why, findings) == (scheme, why, [])


@pytest.mark.parametrize("groups", [[], "g", ["g"], 3])
@pytest.mark.parametrize("qc", [CT, NVFP4], ids=["compressed-tensors", "modelopt"])
def test_config_groups_of_the_wrong_type_are_refused(tmp_path, qc, groups):
    """compressed-tensors calls `.items()` on them (vLLM crashes on a list); ModelOpt silently reads W4A4. Either way
    the config does not say what it means: a LintError naming the key, never a silent reading (once `[]` read as
    "unquantized")."""
    with pytest.raises(LintError, match=r"config.json: quantization_config.config_groups is a (list|str|int), not a "
                                        "mapping"):
        lint.declared(_write(tmp_path, {**qc, "config_groups": groups}, {}))


def test_declared_without_quantization_and_from_the_legacy_file(tmp_path):
    assert lint.declared(_write(tmp_path / "a", None, {}))[0] == Declared(
        "none", "unquantized", "config.json has no quantization_config", ())
    legacy = _write(tmp_path / "b", None, {})
    (legacy / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "W4A16_NVFP4",
                                                                              "exclude_modules": ["lm_head"]}}))
    assert lint.declared(legacy)[0] == Declared("modelopt", "weight_only", "hf_quant_config.json quant_algo "
                                                "W4A16_NVFP4, no config_groups", ("lm_head",))
    (legacy / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    assert lint.declared(legacy)[0].scheme == "w4a4"


def test_config_findings_stay_among_the_lints_findings(tmp_path):
    mixed = {**NVFP4, "config_groups": {"a": {"input_activations": None}, "b": {"input_activations": {"x": 1}}}}
    d = _write(tmp_path, mixed, _module("a"), experts=0)
    save_file({"a.input_scale": torch.tensor(0.25)}, str(d / "more.safetensors"))
    assert [f.code for f in lint.lint(d).findings] == ["config", "inconsistent"]


def test_groups_that_disagree_are_a_config_finding(tmp_path):
    mixed = {**NVFP4, "config_groups": {"a": {"input_activations": None}, "b": {"input_activations": {"x": 1}}}}
    d, findings = lint.declared(_write(tmp_path / "a", mixed, {}))
    assert d.scheme == "w4a4" and findings == [Finding(
        "config", "config.json", "", "config_groups disagree (a input_activations null, b input_activations "
        "quantized); vLLM promotes to weight-only only when every group says None, so it runs all of them W4A4")]
    ct = {**CT, "config_groups": {"a": {"input_activations": None}, "b": {"input_activations": {"x": 1}}}}
    d, findings = lint.declared(_write(tmp_path / "b", ct, {}))
    assert d.scheme == "w4a4" and findings == [Finding(
        "config", "config.json", "", "config_groups disagree (a input_activations null, b input_activations "
        "quantized); this lint checks every module against W4A4")]
    for groups in ({"a": {"input_activations": None}, "b": {}}, {"a": {"input_activations": {"x": 1}}}):
        assert lint.declared(_write(tmp_path / "c", {**CT, "config_groups": groups}, {}))[1] == []


def test_config_groups_that_are_not_a_mapping_are_refused(tmp_path):
    """vLLM 0.32 itself crashes on a list here (tests/test_declared_vllm.py); the lint once read it as "no group,
    unquantized" and passed (issue 31): now the config is refused, naming the key."""
    with pytest.raises(LintError, match=r"config_groups is a list, not a mapping"):
        lint.declared(_write(tmp_path, {**CT, "config_groups": [1]}, {}))


@pytest.mark.parametrize(("qc", "legacy", "error"), [
    ([1], None, "config.json: quantization_config is list, not an object"),
    (None, {"quantization": [1]}, "hf_quant_config.json: quantization is list, not an object"),
    (None, {"quantization": {"quant_algo": "W4A8_AWQ"}}, "hf_quant_config.json: quant_algo 'W4A8_AWQ' is not one "
                                                          "this lint knows "
     "(NVFP4, W4A16_NVFP4, FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, MXFP8)"),
    ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, None, "config.json: quant_algo 'W4A8_AWQ' is not one "
                                                                   "this lint knows "
     "(NVFP4, W4A16_NVFP4, FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, MXFP8)"),
    ({**CT, "format": "pack-quantized"}, None, "config.json: compressed-tensors format 'pack-quantized' is not "
                                               "nvfp4-pack-quantized, float-quantized or pack-quantized with int "
                                               "weights"),
    ({"quant_method": "fp8", "activation_scheme": "per-token"}, None, "config.json: fp8 activation_scheme "
                                                                      "'per-token' is neither static nor dynamic"),
    ({"quant_method": "bitsandbytes"}, None, "config.json: quant_method 'bitsandbytes' is none of modelopt, "
                                             "compressed-tensors, fp8, gptq, awq, mxfp4"),
    ({**NVFP4, "ignore": "lm_head"}, None, "config.json: the ignore list must be a list of strings, got lm_head"),
    ({**NVFP4, "ignore": [1]}, None, "config.json: the ignore list must be a list of strings, got [1]"),
    ({**NVFP4, "ignore": "x" * 100}, None, f"config.json: the ignore list must be a list of strings, got {'x' * 80}"),
    ({**NVFP4, "ignore": ["re:("]}, None, "config.json: ignore pattern '(' is not a regular expression RE2 matches "
                                          "in linear time (missing ): ()"),
    # a backreference has no linear-time match: refused by name (`(a+)+` no longer is: RE2 matches it linearly)
    ({**CT, "ignore": ["re:(a)\\1"]}, None, "config.json: ignore pattern '(a)\\\\1' is not a regular expression "
                                            "RE2 matches in linear time (invalid escape sequence: \\1)"),
    (None, {"quantization": {"quant_algo": "NVFP4", "exclude_modules": [2]}},
     "hf_quant_config.json: the ignore list must be a list of strings, got [2]"),
    (None, {}, "hf_quant_config.json: quant_algo None is not one this lint knows "
     "(NVFP4, W4A16_NVFP4, FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, MXFP8)"),
])
def test_a_declaration_this_lint_cannot_read_is_an_error(tmp_path, qc, legacy, error):
    d = _write(tmp_path, qc, {})
    if legacy is not None:
        (d / "hf_quant_config.json").write_text(json.dumps(legacy))
    with pytest.raises(LintError) as e:
        lint.declared(d)
    assert str(e.value).endswith(error)


def test_config_files_that_are_not_json_objects_are_named(tmp_path):
    d = _write(tmp_path, None, {})
    (d / "config.json").write_text("[1]")
    with pytest.raises(LintError, match=r"/config.json: config.json is list, not an object$"):
        lint.declared(d)
    (d / "config.json").write_text("{}")
    (d / "hf_quant_config.json").write_text("{")
    with pytest.raises(LintError, match=r"/hf_quant_config.json: cannot read hf_quant_config.json \(Expecting"):
        lint.declared(d)


def test_ignore_lists_come_from_ignore_or_exclude_modules(tmp_path):
    assert lint.declared(_write(tmp_path / "a", {**NVFP4, "exclude_modules": ["x"]}, {}))[0].ignore == ("x",)
    assert lint.declared(_write(tmp_path / "b", {**NVFP4, "ignore": ["re:.*gate$"]}, {}))[0].ignore == ("re:.*gate$",)
    assert lint.declared(_write(tmp_path / "c", {**CT, "ignore": ["lm_head"]}, {}))[0].ignore == ("lm_head",)


@pytest.mark.parametrize(("module", "patterns", "hit"), [
    ("lm_head", ["lm_head"], True), ("model.layers.0.mlp.gate", ["re:.*mlp\\.gate$"], True),
    ("model.layers.0.mlp.gate", ["re:mlp"], False), ("model.layers.3.self_attn.q_proj", ["*.self_attn.*"], True),
    ("model.layers.3.self_attn", ["model.layers.3"], True), ("model.layers.30", ["model.layers.3"], False),
    ("lm_head", [], False),
])
def test_ignored_by_name_prefix_glob_or_anchored_regex(module, patterns, hit):
    assert lint.ignored(module, patterns) is hit


# --------------------------------------------------------------------------------------- module findings


def test_a_sound_module_is_clean_and_the_report_says_so(tmp_path):
    d = _write(tmp_path, {**NVFP4, "ignore": ["lm_head", "re:.*norm"]},
               {**_module(E0 + ".up_proj"), "lm_head.weight": torch.zeros(2, 2)})
    report = lint.lint(d, block_scales=True)
    assert report.findings == [] and report.codes() == set()
    assert (report.tensors, report.files, report.nvfp4_modules) == (5, 1, 1)
    assert report.render() == "\n".join([
        f"quantmatrix lint {d}",
        "declared: modelopt w4a4 (config.json quant_algo NVFP4, g input_activations quantized); ignore: lm_head, "
        "re:.*norm",
        "read: 1 safetensors file(s), 5 tensors, 1 NVFP4 modules (headers, per-tensor scales and group indices only)",
        "OK: every tensor agrees with the declared scheme"])


def test_missing_input_scale_says_what_the_kernel_would_read(tmp_path):
    d = _write(tmp_path, NVFP4, _module(E0 + ".up_proj", inputs=False))
    assert _findings(d) == [
        f"missing_tensor {E0}.up_proj [layer 0, expert 0] input_scale: missing; the config declares W4A4 (config.json "
        "quant_algo NVFP4, g input_activations quantized); vLLM's W4A4 MoE kernels fold it into the dequant alphas, "
        "so the buffer it never loaded (uninitialised memory) would scale this expert"]


def test_missing_weight_tensors_and_a_stray_input_scale(tmp_path):
    t = _module("lm_head", producer="compressed-tensors")
    del t["lm_head.weight_packed"], t["lm_head.weight_global_scale"]
    d = _write(tmp_path / "a", {**CT, "config_groups": {"g": {"input_activations": None}}}, t, experts=0)
    why = "weight-only (config.json format nvfp4-pack-quantized, g input_activations null)"
    assert _findings(d) == [
        f"missing_tensor lm_head weight_packed: missing; the config declares {why}",
        f"missing_tensor lm_head weight_global_scale: missing; the config declares {why}",
        f"unexpected_tensor lm_head input_global_scale: present, but the config declares {why}: vLLM's weight-only "
        "path discards it, so the export and its config disagree about the activations"]


def test_leaves_of_the_other_producer_or_of_none(tmp_path):
    t = {**_module("lm_head"), "lm_head.weight_global_scale": torch.tensor(1.0), "lm_head.odd": torch.zeros(1),
         "lm_head.bias": torch.zeros(4), "lm_head.k_scale": torch.tensor(1.0)}
    assert _findings(_write(tmp_path, NVFP4, t, experts=0)) == [
        "unexpected_tensor lm_head odd: not part of a modelopt NVFP4 module",
        "unexpected_tensor lm_head weight_global_scale: not part of a modelopt NVFP4 module (a name of the other "
        "producer)"]


def test_weight_and_block_scale_dtypes_and_shapes(tmp_path):
    t = _module("m.a") | _module("m.b") | _module("m.c")
    t["m.a.weight"] = torch.zeros(4, 16, dtype=torch.bfloat16)
    t["m.a.weight_scale"] = torch.ones(4, 2)
    t["m.b.weight"] = torch.zeros(2, 4, 16, dtype=torch.uint8)
    t["m.c.weight_scale"] = torch.ones(4, 3).to(torch.float8_e4m3fn)
    assert _findings(_write(tmp_path, NVFP4, t, experts=0)) == [
        "bad_dtype m.a weight: is BF16 [4, 16]; packed e2m1 is U8 [out, in/2]",
        "bad_dtype m.a weight_scale: is F32; block scales are F8_E4M3",
        "bad_shape m.b weight: is U8 [2, 4, 16]; packed e2m1 is U8 [out, in/2]",
        "bad_shape m.c weight_scale: is [4, 3], expected [4, 2] (one per 16 inputs of weight [4, 16])"]


def test_packed_inputs_must_be_whole_blocks_of_16(tmp_path):
    t = _module("model.x")
    t["model.x.weight"] = torch.zeros(4, 12, dtype=torch.uint8)
    t["model.x.weight_scale"] = torch.ones(4, 1).to(torch.float8_e4m3fn)
    assert _findings(_write(tmp_path, NVFP4, t, experts=0)) == [
        "bad_shape model.x weight: is [4, 12]: 24 inputs, not whole blocks of 16 (one E4M3 scale per 16 inputs)"]


def test_one_block_of_16_inputs_is_whole(tmp_path):
    t = _module("m")
    t["m.weight"] = torch.zeros(4, 8, dtype=torch.uint8)
    t["m.weight_scale"] = torch.ones(4, 1).to(torch.float8_e4m3fn)
    assert _findings(_write(tmp_path, NVFP4, t, experts=0)) == []


def test_a_missing_global_scale_does_not_hide_a_bad_input_scale(tmp_path):
    t = _module("a", input_scale=float("inf"))
    del t["a.weight_scale_2"]
    assert [f.code for f in lint.lint(_write(tmp_path, NVFP4, t, experts=0)).findings] == [
        "missing_tensor", "bad_value"]


def test_block_scales_that_are_nan_or_zero_are_counted(tmp_path):
    t = _module("a")
    raw = torch.tensor([[0x7F, 0x00], [0xFF, 0x80], [0x38, 0x38], [0x38, 0x7F]], dtype=torch.uint8)
    t["a.weight_scale"] = raw.view(torch.float8_e4m3fn)
    d = _write(tmp_path, NVFP4, t, experts=0)
    assert _findings(d) == ["bad_value a weight_scale: 3 NaN and 2 zero of 8 block scales"]
    assert lint.lint(d).findings == []  # without block_scales only headers and per-tensor scales are read
    t["a.weight_scale"] = torch.full((4, 2), 0x80, dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert _findings(_write(tmp_path / "z", NVFP4, t, experts=0)) == [
        "bad_value a weight_scale: 0 NaN and 8 zero of 8 block scales"]


@pytest.mark.parametrize(("value", "finding"), [
    (torch.tensor(float("inf")), "bad_value a weight_scale_2: is inf; a scale must be finite and > 0"),
    (torch.tensor(float("nan")), "bad_value a weight_scale_2: is nan; a scale must be finite and > 0"),
    (torch.tensor(0.0), "bad_value a weight_scale_2: is 0.0; a scale must be finite and > 0"),
    (torch.tensor(-0.5), "bad_value a weight_scale_2: is -0.5; a scale must be finite and > 0"),
    (torch.tensor([0.5, 0.5]), "bad_shape a weight_scale_2: is [2]; a per-tensor scale has one element"),
    (torch.tensor(0.5, dtype=torch.bfloat16), "bad_dtype a weight_scale_2: is BF16; per-tensor scales are F32"),
])
def test_per_tensor_scales_must_be_one_finite_positive_f32(tmp_path, value, finding):
    t = _module("a")
    t["a.weight_scale_2"] = value
    assert _findings(_write(tmp_path, NVFP4, t, experts=0)) == [finding]


def test_a_tiny_positive_scale_is_fine(tmp_path):
    assert _findings(_write(tmp_path, NVFP4, _module("a", scale_2=1e-30), experts=0)) == []


# ---------------------------------------------------------------------------------- experts and fusion


def _expert(layer: int, e: int, proj: str, **kw: object) -> dict[str, torch.Tensor]:
    return _module(f"model.layers.{layer}.mlp.experts.{e}.{proj}", **kw)


def test_experts_missing_against_config_and_siblings(tmp_path):
    t = _expert(0, 0, "up_proj") | _expert(0, 1, "down_proj")
    missing = [(0, "down_proj"), (2, "down_proj"), (1, "up_proj"), (2, "up_proj")]
    assert _findings(_write(tmp_path, NVFP4, t, experts=3)) == [
        f"missing_tensor model.layers.0.mlp.experts.{e}.{p} [layer 0, expert {e}] (config): no tensors at all; "
        f"config.json says 3 experts and siblings have {p}" for e, p in missing]


def test_more_missing_experts_than_listed_are_summarised(tmp_path):
    n = lint.EXPERT_FINDINGS + 3
    found = lint.lint(_write(tmp_path, NVFP4, _expert(0, 0, "up_proj"), experts=n)).findings
    assert len(found) == lint.EXPERT_FINDINGS + 1
    assert found[lint.EXPERT_FINDINGS - 1].module == f"model.layers.0.mlp.experts.{lint.EXPERT_FINDINGS}.up_proj"
    assert found[-1] == Finding("missing_tensor", "model.layers.0.mlp.experts.*.up_proj", "",
                                f"and 2 more experts (up to {n - 1}) have no up_proj either")
    assert found[0] == Finding("missing_tensor", "model.layers.0.mlp.experts.1.up_proj", "", "no tensors at all; "
                               f"config.json says {n} experts and siblings have up_proj")


def test_exactly_as_many_missing_experts_as_listed_need_no_summary(tmp_path):
    found = lint.lint(_write(tmp_path, NVFP4, _expert(0, 0, "up_proj"), experts=lint.EXPERT_FINDINGS + 1)).findings
    assert len(found) == lint.EXPERT_FINDINGS and "*" not in found[-1].module


@pytest.mark.parametrize("n", [-1, lint.MAX_EXPERTS + 1, "8", 2.0, True])
def test_an_expert_count_that_is_not_a_small_integer_is_an_error(tmp_path, n):
    with pytest.raises(LintError, match=r"config.json: num_experts .* is not an integer from 0 to 65536$"):
        lint.lint(_write(tmp_path, NVFP4, _module("a"), experts=n))


def test_the_expert_count_may_be_named_num_local_experts_and_be_the_maximum(tmp_path):
    d = _write(tmp_path / "a", NVFP4, _expert(0, 0, "up_proj"), experts=None, num_local_experts=2)
    assert [f.module for f in lint.lint(d).findings] == ["model.layers.0.mlp.experts.1.up_proj"]
    assert lint.lint(_write(tmp_path / "b", NVFP4, _module("a"), experts=None)).findings == []  # no count: 0
    assert lint.lint(_write(tmp_path / "c", NVFP4, _module("a"), experts=lint.MAX_EXPERTS)).findings == []


def test_an_expert_count_error_names_the_value_cut_at_40_characters(tmp_path):
    with pytest.raises(LintError) as e:
        lint.lint(_write(tmp_path / "a", NVFP4, _module("a"), experts="many"))
    assert str(e.value) == f"{tmp_path}/a/config.json: num_experts many is not an integer from 0 to 65536"
    with pytest.raises(LintError) as e:
        lint.lint(_write(tmp_path / "b", NVFP4, _module("a"), experts="x" * 50))
    assert str(e.value) == f"{tmp_path}/b/config.json: num_experts {'x' * 40} is not an integer from 0 to 65536"


def test_without_an_expert_count_no_expert_is_expected(tmp_path):
    assert lint.lint(_write(tmp_path, NVFP4, _expert(0, 1, "up_proj"), experts=None)).findings == []


def test_experts_are_numbered_after_the_last_experts_and_may_nest_their_projections(tmp_path):
    """`experts.<n>.` is an expert; a name with an unnumbered `experts.` part (a shared block) is not, and a
    projection nested one level deeper still belongs to its expert."""
    t = _module("model.experts.shared.layers.0.mlp.experts.0.up_proj") | _module(
        "model.layers.0.mlp.experts.shared.up_proj") | _module("model.layers.1.mlp.experts.0.proj.up")
    found = lint.lint(_write(tmp_path, NVFP4, t, experts=2)).findings
    assert [f.module for f in found] == ["model.experts.shared.layers.0.mlp.experts.1.up_proj",
                                         "model.layers.1.mlp.experts.1.proj.up"]


def test_gate_and_up_must_share_their_global_scale(tmp_path):
    t = _expert(0, 0, "gate_proj", scale_2=0.5) | _expert(0, 0, "up_proj", scale_2=0.25)
    t |= _expert(0, 1, "gate_proj", scale_2=0.5) | _expert(0, 1, "up_proj", scale_2=0.5)
    assert _findings(_write(tmp_path, NVFP4, t, experts=2)) == [
        "inconsistent model.layers.0.mlp.experts.0.gate_proj [layer 0, expert 0] weight_scale_2: 0.5 but up_proj has "
        "0.25; vLLM uses one value for the fused gate_proj/up_proj weight (warns, takes one of them)"]


def test_mixtral_w1_w3_share_too_and_a_non_finite_pair_is_left_to_bad_value(tmp_path):
    t = _module("model.layers.0.block_sparse_moe.experts.0.w1", scale_2=0.5)
    t |= _module("model.layers.0.block_sparse_moe.experts.0.w3", scale_2=0.75)
    found = lint.lint(_write(tmp_path / "a", NVFP4, t, experts=1)).findings
    assert [(f.code, f.module.rsplit(".", 1)[1]) for f in found] == [("inconsistent", "w1")]
    t = _expert(0, 0, "gate_proj", scale_2=float("inf")) | _expert(0, 0, "up_proj", scale_2=0.5)
    assert [f.code for f in lint.lint(_write(tmp_path / "b", NVFP4, t)).findings] == ["bad_value"]
    t = _expert(0, 0, "gate_proj", scale_2=0.5) | _expert(0, 0, "up_proj", scale_2=float("nan"))
    assert [f.code for f in lint.lint(_write(tmp_path / "c", NVFP4, t)).findings] == ["bad_value"]
    t = _module("model.layers.0.self_attn.gate_proj", scale_2=0.5) | _module("model.layers.0.self_attn.up_proj",
                                                                              scale_2=0.25)
    assert lint.lint(_write(tmp_path / "d", NVFP4, t, experts=0)).findings == []  # not experts: not fused
    alone = _expert(0, 0, "gate_proj") | _expert(0, 1, "gate_proj")
    assert lint.lint(_write(tmp_path / "e", NVFP4, alone, experts=2)).findings == []  # no up_proj to compare


def test_a_fused_pair_with_a_malformed_scale_is_not_compared(tmp_path):
    t = _expert(0, 0, "gate_proj", scale_2=0.5) | _expert(0, 0, "up_proj")
    t["model.layers.0.mlp.experts.0.up_proj.weight_scale_2"] = torch.tensor([0.25, 0.25])
    assert [f.code for f in lint.lint(_write(tmp_path / "a", NVFP4, t)).findings] == ["bad_shape"]
    t["model.layers.0.mlp.experts.0.up_proj.weight_scale_2"] = torch.tensor(0.25, dtype=torch.float64)
    assert [f.code for f in lint.lint(_write(tmp_path / "b", NVFP4, t)).findings] == ["bad_dtype"]


# ------------------------------------------------------------------------------------------ whole lint


def test_unquantized_declaration_holding_nvfp4_and_a_bare_linear(tmp_path):
    t = _module("a") | {"model.embed_tokens.weight": torch.zeros(4, 4), "b.weight": torch.zeros(4, 4),
                        "norm.weight": torch.zeros(4)}
    assert [f.tensor for f in lint.lint(_write(tmp_path / "a", None, t, experts=0)).findings] == [""]
    assert [f.tensor for f in lint.lint(_write(tmp_path / "c", {**NVFP4, "ignore": ["a"]}, t, experts=0)).findings
            ] == ["", "weight"]
    assert _findings(_write(tmp_path / "a", None, t, experts=0)) == [
        "unexpected_tensor a (config): holds NVFP4 tensors (input_scale, weight, weight_scale, weight_scale_2) but the "
        "config declares no quantization"]
    assert _findings(_write(tmp_path / "b", NVFP4, t, experts=0)) == [
        "unquantized b weight: is F32 [4, 4] with no scales, but the config quantizes every Linear it does not ignore"]
    assert _findings(_write(tmp_path / "c", {**NVFP4, "ignore": ["a"]}, t, experts=0)) == [
        "quantized_but_ignored a (config): matches the config's ignore list but holds NVFP4 tensors (input_scale, "
        "weight, weight_scale, weight_scale_2)",
        "unquantized b weight: is F32 [4, 4] with no scales, but the config quantizes every Linear it does not ignore"]


def test_a_u8_weight_alone_makes_a_module_nvfp4(tmp_path):
    t = {"a.weight": torch.zeros(4, 16, dtype=torch.uint8)}
    found = lint.lint(_write(tmp_path, NVFP4, t, experts=0))
    assert found.nvfp4_modules == 1 and [f.tensor for f in found.findings] == [
        "weight_scale", "weight_scale_2", "input_scale"]


def test_a_tensor_stored_twice_and_the_report_of_findings(tmp_path):
    d = _write(tmp_path, NVFP4, _module("m.a"), experts=0)
    save_file({"m.a.input_scale": torch.tensor(0.25)}, str(d / "more.safetensors"))
    report = lint.lint(d)
    assert report.files == 2 and report.tensors == 4
    assert report.findings == [Finding("inconsistent", "m.a", "input_scale",
                                       "stored twice (model.safetensors and more.safetensors)")]
    assert report.render().splitlines()[3:] == [
        "FAIL: 1 finding(s) (inconsistent 1)",
        "  m.a input_scale: stored twice (model.safetensors and more.safetensors)"]


def test_the_report_counts_findings_per_code_in_order(tmp_path):
    declared = Declared("modelopt", "w4a4", "why", ())
    f = [Finding("b", "m", "t", "x"), Finding("a", "m", "", "y"), Finding("b", "n", "t", "z")]
    lines = LintReport(tmp_path, declared, 3, 1, 2, f).render().splitlines()
    assert lines[1] == "declared: modelopt w4a4 (why); ignore: -"
    assert lines[3] == "FAIL: 3 finding(s) (a 1, b 2)"


def test_a_directory_without_tensors_is_an_error(tmp_path):
    with pytest.raises(LintError, match="no \\*.safetensors files with tensors$"):
        lint.lint(_write(tmp_path, NVFP4, {}))


# ----------------------------------------------------------------------------- the verdict, per tensor


def _report(*findings: Finding) -> LintReport:
    return LintReport(Path("ck"), Declared("modelopt", "w4a4", "why", ()), 9, 1, 3, list(findings))


PLANTED = [Finding("bad_value", "model.layers.0.mlp.experts.0.down_proj", "weight_scale_2", "is 0.0"),
           Finding("bad_value", "model.layers.0.mlp.experts.1.down_proj", "input_scale", "is inf"),
           Finding("bad_value", "model.layers.1.mlp.experts.2.up_proj", "weight_scale", "1 NaN")]
PINNED = tuple(TensorFinding("bad_value", f.name) for f in PLANTED)


def test_three_planted_bad_values_are_three_findings_to_show():
    """With codes only, one bad_value anywhere would pass; pinned per tensor, the lint must find each."""
    assert lint_problem(PINNED, _report(*PLANTED)) is None
    assert lint_problem(("bad_value",), _report(PLANTED[0])) is None  # what a set of codes let through
    problem = lint_problem(PINNED, _report(PLANTED[0]))
    assert problem.splitlines()[0] == (
        "expected bad_value on model.layers.0.mlp.experts.1.down_proj.input_scale: no such finding there; "
        "expected bad_value on model.layers.1.mlp.experts.2.up_proj.weight_scale: no such finding there")


def test_a_finding_of_the_right_code_on_another_tensor_is_unexpected():
    moved = Finding("bad_value", "model.layers.0.mlp.experts.0.up_proj", "weight_scale_2", "is 0.0")
    problem = lint_problem(PINNED[:1], _report(moved))
    assert problem.splitlines()[:3] == [
        "expected bad_value on model.layers.0.mlp.experts.0.down_proj.weight_scale_2: no such finding there; "
        "unexpected findings ['bad_value']",
        "  bad_value: model.layers.0.mlp.experts.0.up_proj [layer 0, expert 0] weight_scale_2: is 0.0",
        "quantmatrix lint ck"]


def test_a_pinned_code_must_match_too_and_globs_name_many_tensors():
    wrong_code = Finding("bad_shape", PLANTED[0].module, PLANTED[0].tensor, "is [2]")
    assert lint_problem(PINNED[:1], _report(wrong_code)).startswith(
        "expected bad_value on model.layers.0.mlp.experts.0.down_proj.weight_scale_2: no such finding there; "
        "unexpected findings ['bad_shape']\n  bad_shape: ")
    hole = (TensorFinding("missing_tensor", "model.layers.1.mlp.experts.3.*.input_scale"),)
    found = [Finding("missing_tensor", f"model.layers.1.mlp.experts.3.{p}", "input_scale", "missing")
             for p in ("gate_proj", "up_proj", "down_proj")]
    assert lint_problem(hole, _report(*found)) is None
    whole = Finding("missing_tensor", "model.layers.1.mlp.experts.3.up_proj", "", "no tensors at all")
    assert lint_problem((TensorFinding("missing_tensor", "model.layers.1.mlp.experts.3.up_proj"),),
                        _report(whole)) is None


def test_codes_and_pins_together():
    extra = Finding("unexpected_tensor", "m", "input_scale", "present")
    assert lint_problem(("unexpected_tensor", *PINNED), _report(*PLANTED, extra)) is None
    problem = lint_problem(("missing_tensor", *PINNED), _report(*PLANTED, extra))
    assert problem.splitlines()[:2] == ["expected findings ['missing_tensor'] did not appear; unexpected "
                                        "findings ['unexpected_tensor']", "  unexpected_tensor: m input_scale: present"]
    assert lint_problem((), _report()) is None


def test_the_matrix_pins_findings_per_tensor_and_refuses_a_malformed_pin(tmp_path):
    """The default matrix's bad-scale checkpoint pins each of its three planted faults; a pin with an unknown code
    or key is a matrix error at its line."""
    from quantmatrix.errors import MatrixError
    from quantmatrix.schema.load import load

    root = Path(__file__).resolve().parents[1]
    matrix = load(root / "matrices" / "default.yaml")
    ck = next(c for c in matrix.checkpoints if c.id == "qwen3moe-tiny-nvfp4-w4a4-bad-scale-values")
    assert ck.expectation("lint") == tuple(TensorFinding("bad_value", t) for t, _ in ck.source.value["corrupt_tensors"])
    text = (root / "matrices" / "default.yaml").read_text()
    for bad, error in (("{code: bad_valu, tensor: x}", "expected one of"), ("{code: bad_value, where: x}",
                                                                            "unknown key 'where'")):
        broken = tmp_path / "m.yaml"
        broken.write_text(text.replace("lint: [unexpected_tensor]", f"lint: [{bad}]"))
        with pytest.raises(MatrixError, match=f"m.yaml:\\d+:\\d+: .*{error}"):
            load(broken)
