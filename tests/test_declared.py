"""adapter.declared without vLLM: the words for each config group's activations (the one vocabulary the lint,
config dispatch and the guard print), the groups' disagreement, and where the guard finds a model's quantization
config. tests/test_declared_vllm.py holds the same classifier against vLLM's real resolution."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from quantmatrix.adapter import declared
from quantmatrix.adapter.declared import Declaration, IntWeights, declare, group_activations
from quantmatrix.errors import AdapterMismatch


@pytest.mark.parametrize(("group", "words"), [
    ({"input_activations": None}, "null"),
    ({"targets": ["Linear"]}, "missing"),
    ({"input_activations": {}}, "empty"),
    ({"input_activations": {"num_bits": 4}}, "quantized"),
    (3, "not-a-mapping"),
    (None, "not-a-mapping"),
    ({"input_activations": [1]}, "unexpected list"),
    ({"input_activations": ""}, "unexpected str"),
])
def test_each_group_shape_has_one_name(group, words):
    assert group_activations(group) == words


@pytest.mark.parametrize(("qc", "text"), [
    ({"quant_method": "modelopt", "config_groups": {"a": None, "b": {}}},
     "a input_activations not-a-mapping, b input_activations missing"),
    ({"quant_method": "modelopt"}, "config_groups missing"),
    ({"quant_method": "modelopt", "config_groups": None}, "config_groups empty"),
    ({"quant_method": "modelopt", "config_groups": {}}, "config_groups empty"),
    ({"quant_method": "modelopt", "config_groups": "x"}, "config_groups is a str"),
])
def test_the_groups_in_words(qc, text):
    assert declare(qc).groups_text() == text


def test_groups_disagree_on_the_question_their_producer_asks():
    """ModelOpt asks "is it None?" (an empty mapping is not), compressed-tensors "is it truthy?" (it is not)."""
    groups = {"a": {"input_activations": None}, "b": {"input_activations": {}}}
    mo = declare({"quant_method": "modelopt", "quant_algo": "NVFP4", "config_groups": groups})
    assert (mo.scheme, mo.disagree) == ("w4a4", True)
    ct = declare({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": groups})
    assert (ct.scheme, ct.disagree) == ("weight_only", False)


@pytest.mark.parametrize(("qc", "producer", "scheme", "algo"), [
    ({"quant_method": "modelopt_fp4", "quantization": {"quant_algo": "nvfp4"}}, "modelopt", "w4a4", "NVFP4"),
    ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "modelopt", None, "W4A8_AWQ"),
    ({"quant_method": "modelopt"}, "modelopt", None, None),
    ({"quant_method": "compressed-tensors", "format": "int-quantized"}, "compressed-tensors", None, None),
    ({"quant_method": "bitsandbytes"}, "bitsandbytes", None, None),
    ({"quant_method": ""}, "none", "unquantized", None),
])
def test_what_no_family_reads_has_no_scheme(qc, producer, scheme, algo):
    d = declare(qc)
    assert (d.producer, d.scheme, d.algo) == (producer, scheme, algo)


@pytest.mark.parametrize(("qc", "scheme", "family"), [
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "w4a4", "nvfp4"),
    ({"quant_method": "modelopt", "quant_algo": "MXFP8"}, "mxfp8", "mxfp8"),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8_static", "fp8"),
    ({"quant_method": "modelopt", "quant_algo": "FP8_PB_WO"}, "fp8_block", "fp8_block"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8_dynamic", "fp8"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "fp8_block",
     "fp8_block"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
        "g": {"weights": {"type": "float", "strategy": "channel"}, "input_activations": {"dynamic": True}}}},
     "fp8_dynamic", "fp8"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "weight_only", "wna16"),
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {
        "g": {"input_activations": None}}}, "weight_only", "nvfp4"),
])
def test_the_family_names_the_scheme_module_whose_tensors_the_lint_checks(qc, scheme, family):
    """Two families read weight_only (NVFP4 W4A16, integer WNA16): the lint picks its module check by family."""
    d = declare(qc)
    assert (d.scheme, d.family) == (scheme, family)


@pytest.mark.parametrize(("qc", "scheme", "weights"), [
    ({"quant_method": "GPTQ"}, "weight_only", IntWeights(4, 128, False, True)),  # GPTQ's defaults
    ({"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": True, "sym": True}, "weight_only",
     IntWeights(8, -1, True, True)),
    ({"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True}, "weight_only",
     IntWeights(4, 32, False, False)),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
        "weights": {"type": "int", "num_bits": 8, "strategy": "channel", "symmetric": True}}}}, "weight_only",
     IntWeights(8, -1, False, True)),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
        "weights": {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 32, "actorder": "group"}}}},
     "weight_only", IntWeights(4, 32, True, True)),
    # no group at all: vLLM quantizes nothing, whatever the tensors hold
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {}}, "unquantized", None),
])
def test_integer_weight_only_declarations(qc, scheme, weights):
    """GPTQ, AWQ and compressed-tensors pack-quantized read as integer weight-only, with the bits, groups,
    activation order and zero points the lint checks the tensors against."""
    d = declare(qc)
    assert (d.scheme, d.family, d.weights) == (scheme, "wna16", weights)


def test_no_quantization_config_is_unquantized():
    assert declare(None) == Declaration("none", "unquantized")


def _model(hf: object) -> SimpleNamespace:
    """A stand-in for vLLM's ModelConfig holding only `hf_config` (the real one is read in test_declared_vllm)."""
    return SimpleNamespace(hf_config=hf)


def test_the_guard_finds_the_config_in_vllms_order_stand_in_model_config():
    weight_only = {"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4"}
    w4a4 = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    text = SimpleNamespace(quantization_config=weight_only)
    assert declared.of_model(_model(SimpleNamespace(quantization_config=w4a4, text_config=text))).scheme == "w4a4"
    assert declared.of_model(_model(SimpleNamespace(text_config=text))).scheme == "weight_only"
    assert declared.of_model(_model(SimpleNamespace(compression_config=w4a4))).scheme == "w4a4"
    assert declared.of_model(_model(SimpleNamespace())).scheme == "unquantized"


def test_a_model_config_vllm_moved_is_an_adapter_mismatch_stand_in_model_config():
    with pytest.raises(AdapterMismatch, match="SimpleNamespace has no hf_config"):
        declared.of_model(SimpleNamespace())
    with pytest.raises(AdapterMismatch, match="quantization config as a list, not a dict"):
        declared.of_model(_model(SimpleNamespace(quantization_config=[1])))


@pytest.mark.parametrize(("qc", "scheme"), [
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8_static"),
    ({"quant_method": "modelopt", "quant_algo": "fp8_pb_wo"}, "fp8_block"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "fp8_static"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8_dynamic"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "fp8_block"),
    ({"quant_method": "fp8", "activation_scheme": "per-token"}, None),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
        "g": {"weights": {"strategy": "channel"}, "input_activations": {"dynamic": True}}}}, "fp8_dynamic"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
        "g": {"weights": {"strategy": "tensor"}, "input_activations": {"dynamic": False}}}}, "fp8_static"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
        "g": {"weights": {"strategy": "block"}, "input_activations": {"dynamic": True}}}}, "fp8_block"),
])
def test_fp8_declarations(qc, scheme):
    """FP8 in every producer's words: ModelOpt's quant_algo, Fp8Config's activation_scheme and weight_block_size,
    compressed-tensors' block strategy or dynamic activations."""
    assert declare(qc).scheme == scheme
