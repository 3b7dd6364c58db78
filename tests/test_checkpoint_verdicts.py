"""The checkpoint checks' verdicts (checks/checkpoint.py) at their boundaries, and the decoding dequant_logits
runs (measure/dequant.py), on hand-written files: the logit bounds are inclusive, each verdict records its numbers,
and the packed weights are decoded by vLLM's own dequantization with each producer's global-scale convention."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from matrixkit import case_for
from safetensors.torch import save_file

from quantmatrix import properties as P
from quantmatrix.checkpoints import store
from quantmatrix.checkpoints.lint import Declared, LintReport
from quantmatrix.checkpoints.producers import compressed_tensors as ct
from quantmatrix.checkpoints.producers import modelopt
from quantmatrix.checkpoints.schemes import nvfp4
from quantmatrix.checks import checkpoint
from quantmatrix.checks.checkpoint import LOGIT_REL_ERROR_BOUND as REL
from quantmatrix.checks.checkpoint import TOP1_AGREEMENT_BOUND as TOP1
from quantmatrix.measure import dequant
from quantmatrix.measure.dequant import LogitError
from quantmatrix.measure.hf import HfGreedy
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parents[1]
W4A4 = "qwen3moe-tiny-nvfp4-w4a4"


@pytest.fixture(scope="module")
def matrix():
    return load(ROOT / "matrices" / "default.yaml")


def test_the_logit_bounds_are_inclusive(matrix):
    case = case_for(matrix, W4A4, "dequant_logits")
    assert checkpoint.dequant_verdict(case, LogitError(REL, TOP1)).outcome == "ok"
    assert checkpoint.dequant_verdict(case, LogitError(REL + 1e-9, TOP1)).problem == (
        f"dequantized model strays from bf16: logit relative error {REL + 1e-9:.4f} (bound {REL}), top-1 agreement "
        f"{TOP1:.3f} (bound {TOP1})")
    assert checkpoint.dequant_verdict(case, LogitError(REL, TOP1 - 1e-9)).problem is not None
    assert checkpoint.dequant_verdict(case, LogitError(float("nan"), 1.0)).problem is not None  # NaN never passes


def test_dequant_verdict_names_the_cell_and_records_both_numbers(matrix):
    case = case_for(matrix, W4A4, "dequant_logits")
    ok = checkpoint.dequant_verdict(case, LogitError(0.123456, 0.87654))
    assert ok.problem is None and ok.properties == ((P.LOGIT_REL_ERROR, 0.12346), (P.TOP1_AGREEMENT, 0.8765))
    bad = checkpoint.dequant_verdict(case, LogitError(0.5, 0.5))
    assert bad.message == f"{W4A4}@sm121-default dequant_logits: " + (
        "dequantized model strays from bf16: logit relative error 0.5000 (bound 0.35), top-1 agreement 0.500 "
        "(bound 0.6)")


def test_hf_and_lint_verdicts_record_what_decided(matrix):
    case = case_for(matrix, "qwen3moe-tiny-bf16", "hf_reference")
    differs = checkpoint.hf_verdict(case, HfGreedy(["a", "b"], True, [[1, 2], [3]], [[1, 2], [4]]))
    assert (differs.problem, differs.properties) == (
        "greedy output of the model loaded from its files differs from the same weights' in-memory model (never "
        "saved):\n  'b': in memory [4], from the files [3]", ((P.HF_GREEDY_TOKEN_IDS, [[1, 2], [3]]),))
    same = checkpoint.hf_verdict(case, HfGreedy(["a"], True, [[1, 2]], [[1, 2]]))
    assert (same.outcome, same.properties) == ("ok", ((P.HF_GREEDY_TOKEN_IDS, [[1, 2]]),))
    tokenizer = checkpoint.hf_verdict(case, HfGreedy(["a"], False, [], []))
    assert tokenizer.problem == ("tokenizer.json on disk encodes the prompts differently from the tokenizer the "
                                 "factory trains")
    report = LintReport(Path("ck"), Declared("modelopt", "w4a4", "why", ()), 9, 1, 3, [])
    v = checkpoint.lint_verdict(case_for(matrix, W4A4, "checkpoint_lint"), report)
    assert (v.problem, v.properties) == (None, ((P.LINT_DECLARED, "modelopt w4a4"), (P.LINT_FINDINGS, 0)))


def _export(d: Path, producer: str) -> torch.Tensor:
    """One quantized Linear and one bf16 tensor as `producer` writes them; returns the weight it encodes."""
    torch.manual_seed(0)
    w = torch.randn(8, 32)
    d.mkdir()
    if producer == "modelopt":
        scale_2 = modelopt.nvfp4_scale_2(w.abs().amax())
        q = modelopt.nvfp4_quantize(w, scale_2)
        tensors = {"m.weight": q.packed, "m.weight_scale_2": scale_2, "m.input_scale": torch.tensor(0.5)}
        qc = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
        decode = scale_2
    else:
        gs = ct.nvfp4_global_scale(w.abs().amax())
        q = ct.nvfp4_quantize(w, gs)
        tensors = {"m.weight_packed": q.packed, "m.weight_global_scale": gs, "m.input_global_scale": gs.clone()}
        qc = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}
        decode = 1.0 / gs
    tensors |= {"m.weight_scale": q.scale, "norm.weight": torch.ones(4, dtype=torch.bfloat16)}
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"quantization_config": qc}))
    return nvfp4.dequantize(q.packed, q.scale, decode.reshape(()), torch.bfloat16)


@pytest.mark.parametrize("producer", ["modelopt", "compressed-tensors"])
def test_the_files_decode_by_vllms_dequantization(tmp_path, producer):
    """Each producer's packed weight decodes (through vLLM, inverting compressed-tensors' global scale) to the
    weight the export encodes; scales and activation scales are dropped, other tensors kept as stored."""
    want = _export(tmp_path / "ck", producer)
    state = dequant.dequantized_state(tmp_path / "ck")
    assert sorted(state) == ["m.weight", "norm.weight"]
    assert state["m.weight"].dtype == torch.bfloat16 and torch.equal(state["m.weight"], want)
    assert torch.equal(state["norm.weight"], torch.ones(4, dtype=torch.bfloat16))


def test_a_packed_weight_without_its_scales_cannot_be_decoded(tmp_path):
    _export(tmp_path / "ck", "modelopt")
    path = tmp_path / "ck" / "model.safetensors"
    from safetensors.torch import load_file

    tensors = load_file(path)
    del tensors["m.weight_scale"]
    save_file(tensors, str(path))
    with pytest.raises(ValueError, match=r"m.weight is packed NVFP4 but \['m.weight_scale'\] are missing: the lint "
                                         "names it; this check cannot decode the weight$"):
        dequant.dequantized_state(tmp_path / "ck")


def test_the_digest_sees_names_dtypes_shapes_and_bytes():
    a = {"x": torch.zeros(2, dtype=torch.bfloat16)}
    same = dequant.digest(a)
    assert dequant.digest({"x": torch.zeros(2, dtype=torch.bfloat16)}) == same
    for other in ({"y": torch.zeros(2, dtype=torch.bfloat16)}, {"x": torch.zeros(2, dtype=torch.float16)},
                  {"x": torch.zeros(1, 2, dtype=torch.bfloat16)}, {"x": torch.ones(2, dtype=torch.bfloat16)}):
        assert dequant.digest(other) != same


def test_lint_verdict_fails_on_an_unexpected_finding_and_lists_each(matrix):
    from quantmatrix.checkpoints.lint import Finding

    found = [Finding("bad_value", "m.a", "input_scale", "is inf"), Finding("bad_dtype", "m.b", "weight", "is F32")]
    report = LintReport(Path("ck"), Declared("modelopt", "w4a4", "why", ()), 9, 1, 3, found)
    v = checkpoint.lint_verdict(case_for(matrix, W4A4, "checkpoint_lint"), report)
    assert v.message.splitlines()[:3] == [f"{W4A4}@sm121-default checkpoint_lint: unexpected findings ['bad_dtype', "
                                          "'bad_value']",
                                          "  bad_value: m.a input_scale: is inf", "  bad_dtype: m.b weight: is F32"]
    assert v.properties == ((P.LINT_DECLARED, "modelopt w4a4"), (P.LINT_FINDINGS, 2))


def test_the_bf16_model_of_a_synthetic_checkpoint_is_its_family_base(matrix, monkeypatch):
    monkeypatch.setattr(store, "materialize_spec", lambda spec, label: (spec, label))
    ck = next(c for c in matrix.checkpoints if c.id == W4A4)
    spec, label = store.base_of(ck)
    assert (spec.producer, spec.scheme, spec.model, spec.seed) == ("none", "bf16", "qwen3_moe", 0)
    assert label == f"base-qwen3_moe-{spec.size}-seed0"
