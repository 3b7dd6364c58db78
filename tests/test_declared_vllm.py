"""adapter.declared against the installed vLLM: for every shape of quantization config, the scheme the classifier
reads (from the files, as the lint and config dispatch read them, and from vLLM's own ModelConfig, as the guard
reads it) is the scheme vLLM's real config resolution (adapter.config.resolve) picks. Where the two differ, the
disagreement is written down below with vLLM's side pinned, so a vLLM that changes either side shows here."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from quantmatrix.adapter import config, declared
from quantmatrix.checkpoints import configs, lint
from quantmatrix.checkpoints.producers import compressed_tensors
from quantmatrix.checks import dispatch
from quantmatrix.schema.synthetic import SyntheticSpec

MODEL = configs.model_config("qwen3_moe", "cpu_tiny")  # a tiny Qwen3-MoE config.json, unquantized
CT = compressed_tensors.quantization_config(SyntheticSpec("compressed-tensors", "nvfp4_w4a4"))
CT_GROUP = CT["config_groups"]["group_0"]
MODELOPT_PRODUCER = {"name": "modelopt", "version": "0.31.0"}


def modelopt(algo: str = "NVFP4", groups: Any = None, **extra: Any) -> dict[str, Any]:
    qc: dict[str, Any] = {"quant_method": "modelopt", "quant_algo": algo, "producer": MODELOPT_PRODUCER,
                          "ignore": ["lm_head"], **extra}
    if groups is not None:
        qc["config_groups"] = groups
    return qc


def ct(groups: Any = None, **extra: Any) -> dict[str, Any]:
    qc = {k: copy.deepcopy(v) for k, v in CT.items() if k != "config_groups"} | extra
    if groups is not None:
        qc["config_groups"] = groups
    return qc


def ct_group(acts: Any = ...) -> dict[str, Any]:
    group = {k: v for k, v in copy.deepcopy(CT_GROUP).items() if k != "input_activations"}
    return group if acts is ... else group | {"input_activations": acts}


def legacy(algo: str, producer: dict[str, Any] | None = MODELOPT_PRODUCER, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"quantization": {"quant_algo": algo, "kv_cache_quant_algo": None, "group_size": 16,
                                            "exclude_modules": ["lm_head"]}, **extra}
    return out | ({"producer": producer} if producer else {})


ACTS = CT_GROUP["input_activations"]
NULL, MISSING = {"g": {"input_activations": None}}, {"g": {}}

# (id, config.json quantization_config or None, hf_quant_config.json or None, the scheme vLLM resolves)
AGREE = [
    ("modelopt-every-group-null", modelopt(groups=NULL), None, "weight_only"),
    ("modelopt-key-missing", modelopt(groups=MISSING), None, "weight_only"),
    ("modelopt-two-groups-null-and-missing", modelopt(groups={**NULL, "h": {}}), None, "weight_only"),
    ("modelopt-acts-empty", modelopt(groups={"g": {"input_activations": {}}}), None, "w4a4"),
    ("modelopt-acts-quantized", modelopt(groups={"g": {"input_activations": ACTS}}), None, "w4a4"),
    ("modelopt-acts-a-list", modelopt(groups={"g": {"input_activations": [1]}}), None, "w4a4"),
    ("modelopt-group-not-a-mapping", modelopt(groups={"g": 3}), None, "w4a4"),
    ("modelopt-groups-disagree", modelopt(groups={**NULL, "h": {"input_activations": ACTS}}), None, "w4a4"),
    ("modelopt-groups-empty", modelopt(groups={}), None, "w4a4"),
    ("modelopt-groups-missing", modelopt(), None, "w4a4"),
    ("modelopt-algo-lower-case", modelopt("nvfp4", groups=NULL), None, "weight_only"),
    ("modelopt-method-mixed-case", modelopt(groups=NULL) | {"quant_method": "ModelOpt"}, None, "weight_only"),
    ("modelopt-w4a16-quantized-groups", modelopt("W4A16_NVFP4", groups={"g": {"input_activations": ACTS}}), None,
     "weight_only"),
    ("legacy-nvfp4", None, legacy("NVFP4"), "w4a4"),
    ("legacy-nvfp4-top-level-groups-null", None, legacy("NVFP4", config_groups=NULL), "weight_only"),
    ("ct-acts-null", ct({"group_0": ct_group(None)}), None, "weight_only"),
    ("ct-acts-missing", ct({"group_0": ct_group()}), None, "weight_only"),
    ("ct-acts-empty", ct({"group_0": ct_group({})}), None, "weight_only"),
    ("ct-acts-quantized", ct({"group_0": ct_group(ACTS)}), None, "w4a4"),
    ("ct-groups-empty", ct({}), None, "unquantized"),
    ("ct-groups-missing", ct(), None, "unquantized"),
    ("ct-method-underscore", ct({"group_0": ct_group(ACTS)}, quant_method="compressed_tensors"), None, "w4a4"),
    ("unquantized", None, None, "unquantized"),
]


def _checkpoint(d: Path, qc: dict[str, Any] | None, hf_quant: dict[str, Any] | None, key: str = "quantization_config"
                ) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(MODEL | ({key: qc} if qc is not None else {})))
    if hf_quant is not None:
        (d / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    return d


def _from_files(d: Path) -> declared.Declaration:
    """The classifier fed from the files, the way the lint and config dispatch read them."""
    qc = json.loads((d / "config.json").read_text()).get("quantization_config")
    if qc is None and (d / "hf_quant_config.json").is_file():
        return declared.declare(json.loads((d / "hf_quant_config.json").read_text()), legacy=True)
    return declared.declare(qc)


@pytest.mark.parametrize(("qc", "hf_quant", "scheme"), [a[1:] for a in AGREE], ids=[a[0] for a in AGREE])
def test_the_classifier_reads_each_shape_as_vllm_resolves_it(tmp_path, qc, hf_quant, scheme):
    d = _checkpoint(tmp_path, qc, hf_quant)
    assert config.resolve(d).scheme == scheme
    assert _from_files(d).scheme == scheme
    assert declared.of_model(config.model_config(d)).scheme == scheme  # the guard's reading
    assert lint.declared(d)[0].scheme == scheme
    dispatch.config_shape(d)  # dispatch describes every shape without tripping over it


def test_a_compression_config_is_read_where_vllm_reads_it(tmp_path):
    """Older compressed-tensors exports say `compression_config`; vLLM (and so the guard) reads it there."""
    d = _checkpoint(tmp_path, ct({"group_0": ct_group(None)}), None, key="compression_config")
    assert config.resolve(d).scheme == "weight_only"
    assert declared.of_model(config.model_config(d)) == declared.Declaration(
        "compressed-tensors", "weight_only", None, "nvfp4-pack-quantized", (("group_0", "null"),), "present")


# ------------------------------------------------------------------------- disagreements, written down


def test_disagreement_a_legacy_w4a16_file_is_rejected_by_vllm_but_declares_weight_only(tmp_path):
    """vLLM's ModelArchConfigConvertor knows only FP8 and NVFP4 in a legacy ModelOpt file and refuses W4A16_NVFP4
    before any quant config reads it; the file still declares weight-only, so the lint checks its tensors against
    that, and config_dispatch reports the refusal (matrices/default.yaml: qwen3moe-tiny-nvfp4-w4a16-legacy)."""
    d = _checkpoint(tmp_path, None, legacy("W4A16_NVFP4"))
    got = config.resolve(d)
    assert (got.scheme, got.detail) == ("rejected", "Value error, Unknown ModelOpt quant algo: W4A16_NVFP4")
    assert _from_files(d).scheme == lint.declared(d)[0].scheme == "weight_only"


def test_disagreement_a_legacy_file_without_producer_is_not_read_by_vllm(tmp_path):
    """vLLM names a legacy file's method from `producer.name: modelopt`; without it vLLM finds no quantization
    config at all (and the guard, reading vLLM's view, says so), while the lint reads ModelOpt's own file name."""
    d = _checkpoint(tmp_path, None, legacy("NVFP4", producer=None))
    assert config.resolve(d).scheme == "unquantized"
    assert declared.of_model(config.model_config(d)).scheme == "unquantized"
    assert _from_files(d).scheme == lint.declared(d)[0].scheme == "w4a4"


@pytest.mark.parametrize(("groups", "error", "scheme"), [
    ({"g": 3}, TypeError, "weight_only"),
    ([ct_group(None)], AttributeError, "unquantized"),
], ids=["group-not-a-mapping", "groups-a-list"])
def test_disagreement_compressed_tensors_groups_vllm_cannot_read(tmp_path, groups, error, scheme):
    """vLLM 0.32 crashes (no refusal, a traceback) on compressed-tensors config groups that are not mappings; the
    classifier reads such a group as quantizing nothing. The lint reads a group that is not a mapping the same way,
    and refuses config_groups that are not a mapping at all (issue 31: it once read them as "unquantized", exit 0)."""
    d = _checkpoint(tmp_path, ct(groups), None)
    with pytest.raises(error):
        config.resolve(d)
    assert _from_files(d).scheme == scheme
    if isinstance(groups, list):
        with pytest.raises(lint.LintError, match="config_groups is a list, not a mapping"):
            lint.declared(d)
    else:
        assert lint.declared(d)[0].scheme == scheme


def test_disagreement_modelopt_config_groups_that_are_a_list(tmp_path):
    """vLLM reads ModelOpt config_groups that are a list as no promotion: W4A4, as the classifier (and so the guard)
    does; the lint refuses the config instead of checking its tensors against a reading it cannot state."""
    d = _checkpoint(tmp_path, modelopt(groups=[NULL["g"]]), None)
    assert config.resolve(d).scheme == "w4a4"
    assert _from_files(d).scheme == "w4a4"
    assert declared.of_model(config.model_config(d)).scheme == "w4a4"
    dispatch.config_shape(d)
    with pytest.raises(lint.LintError, match="config_groups is a list, not a mapping"):
        lint.declared(d)


def test_disagreement_a_quantization_config_without_quant_method(tmp_path):
    """vLLM reads a quantization_config that names no method as no quantization; so does the classifier, while the
    lint refuses to guess which producer's tensor names to check."""
    d = _checkpoint(tmp_path, {"quant_algo": "NVFP4", "config_groups": NULL}, None)
    assert config.resolve(d).scheme == "unquantized"
    assert _from_files(d) == declared.Declaration("none", "unquantized", None, None, (("g", "null"),), "present")
    with pytest.raises(lint.LintError, match="quant_method None is none of modelopt, compressed-tensors, fp8, gptq, "
                                             "awq"):
        lint.declared(d)
