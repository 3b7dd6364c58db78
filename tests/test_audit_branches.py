"""Every branch of the post-load audit's verdicts (checks.audit) and of the layer judgement it shares with the
guard (measure.findings), each threshold at its boundary (zero, negative and non-finite scales, one expert row):
hand-built parameters, masks and findings, no vLLM engine. The cases, expectations and backends are the default
matrix's own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from matrixkit import case_for

from quantmatrix import properties as P
from quantmatrix.adapter.layers import LayerBuild, MoELayer
from quantmatrix.adapter.roles import checkpoint_names
from quantmatrix.checkpoints.producers import role_of
from quantmatrix.checks import audit
from quantmatrix.measure import findings, loaded
from quantmatrix.measure.loaded import AuditReport, Finding
from quantmatrix.schema.load import load
from quantmatrix.schema.model import TensorFinding

ROOT = Path(__file__).resolve().parents[1]
EXPERTS = "model.layers.0.mlp.experts.routed_experts."
READS = frozenset({"weight", "block_scale", "global_scale", "input_scale"})


@pytest.fixture(scope="module")
def matrix():
    return load(ROOT / "matrices" / "default.yaml")


def _f(param: str, kind: str, experts: tuple[int, ...] = (), read: bool = True, role: str = "input_scale",
       detail: str = "") -> Finding:
    return Finding(EXPERTS + param, role, kind, experts, read, detail)


def _report(*found: Finding) -> AuditReport:
    return AuditReport("VLLM_CUTLASS", READS, found, frozenset())


# ------------------------------------------------------------------------------------------ Finding / AuditReport


def test_describe_names_one_expert_several_experts_or_none_and_the_detail():
    assert _f("w2_input_scale", "unloaded", (3,)).describe() == EXPERTS + "w2_input_scale [expert 3]: unloaded"
    assert _f("w2_input_scale", "zero", (0, 1, 2, 5, 7, 8), detail="d").describe() == (
        EXPERTS + "w2_input_scale [experts 0-2,5,7-8]: zero (d)")
    assert _f("w2_input_scale", "varies").describe() == EXPERTS + "w2_input_scale: varies"
    assert _f("w2_input_scale", "zero", (4, 5)).describe() == EXPERTS + "w2_input_scale [experts 4-5]: zero"


def test_ranges_sorts_and_joins_runs():
    assert loaded.ranges([]) == ""
    assert loaded.ranges([4]) == "4"
    assert loaded.ranges([5, 3, 4, 9, 1]) == "1,3-5,9"
    assert loaded.ranges([0, 1]) == "0-1"


def test_report_splits_read_holes_unusable_values_and_notes():
    hole = _f("w13_input_scale", "unloaded", (1,))
    unread_hole = _f("w2_input_scale", "unloaded", (1,), read=False)
    bad = [_f("w2_input_scale", k) for k in ("nonfinite", "zero", "negative", "refused")]
    unread_bad = _f("w13_input_scale", "zero", read=False)
    varies = _f("w13_input_scale", "varies")
    r = _report(hole, unread_hole, *bad, unread_bad, varies)
    assert r.read_but_unloaded == [hole]
    assert r.unusable == bad
    assert r.notes == [unread_hole, unread_bad, varies]


# ------------------------------------------------------------------------------------------ checkpoint names


def test_roles_of_both_producers_leaves_fused_or_not_and_everything_else_is_other():
    for leaf, role in (("weight", "weight"), ("weight_packed", "weight"), ("weight_scale", "block_scale"),
                       ("weight_scale_2", "global_scale"), ("weight_global_scale", "global_scale"),
                       ("input_scale", "input_scale"), ("input_global_scale", "input_scale")):
        assert role_of(leaf) == role
        assert role_of(f"{EXPERTS}w13_{leaf}") == role_of(f"{EXPERTS}w2_{leaf}") == role
        assert role_of(f"model.layers.0.mlp.experts.3.down_proj.{leaf}") == role
    for other in ("bias", "model.layers.0.mlp.gate.bias", f"{EXPERTS}w13_bias", "weight_scale.x", "w4_weight"):
        assert role_of(other) == "other", other


def test_a_fused_parameter_stands_for_its_experts_projections_in_both_namings():
    assert checkpoint_names(EXPERTS + "w2_weight_scale_2", (0,)) == (
        EXPERTS + "w2_weight_scale_2", "model.layers.0.mlp.experts.0.down_proj.weight_scale_2",
        "model.layers.0.mlp.experts.0.w2.weight_scale_2")
    assert checkpoint_names("model.layers.1.block_sparse_moe.experts.w13_input_global_scale", (2, 3))[1:] == tuple(
        f"model.layers.1.block_sparse_moe.experts.{e}.{p}.input_global_scale" for e in (2, 3)
        for p in ("gate_proj", "up_proj", "w1", "w3"))
    assert checkpoint_names(EXPERTS + "w13_weight_packed", ()) == (EXPERTS + "w13_weight_packed",)
    for own in ("model.layers.1.mlp.experts.1.gate_proj.input_global_scale", "model.layers.0.mlp.gate.weight",
                "model.layers.0.self_attn.qkv_proj.weight_scale"):
        assert checkpoint_names(own, (1,)) == (own,)


# ------------------------------------------------------------------------------------------ problem_of


def test_nothing_found_and_nothing_expected_passes():
    assert audit.problem_of(_report(_f("w2_input_scale", "varies")), "ck", False) is None


def test_expected_but_nothing_found_names_what_was_expected():
    pin = TensorFinding("zero", "*.experts.0.down_proj.weight_scale_2")
    assert audit.problem_of(_report(), "ck", False, ("unloaded", pin)) == (
        "ck: the matrix expects the audit to find unloaded, zero on *.experts.0.down_proj.weight_scale_2 in "
        "tensors backend VLLM_CUTLASS reads, but every read tensor was loaded and usable")


def test_unloaded_only_says_never_loaded_and_why_input_scale_matters():
    r = _report(_f("w13_input_scale", "unloaded", (3,), detail="2/8 elements"))
    problem = audit.problem_of(r, "ck", False)
    assert problem.startswith("ck: backend VLLM_CUTLASS reads tensors that were never loaded from the checkpoint: "
                              + EXPERTS + "w13_input_scale [expert 3]: unloaded (2/8 elements) - input_scale is "
                              "folded into g1_alphas/g2_alphas")
    assert problem.endswith("(0.0 on GB10 zeroed every expert)")
    weight_only = audit.problem_of(r, "ck", True)
    assert " - weight-only checkpoint routed to a W4A4 fused-MoE backend: it has no input_scale - input_scale " \
           "is folded" in weight_only


def test_an_unloaded_block_scale_gives_no_input_scale_reason():
    problem = audit.problem_of(_report(_f("w2_weight_scale", "unloaded", (0,), role="block_scale")), "ck", True)
    assert problem == f"ck: backend VLLM_CUTLASS reads tensors that were never loaded from the checkpoint: " \
                      f"{EXPERTS}w2_weight_scale [expert 0]: unloaded"


def test_unusable_only_and_both_kinds_name_each_tensor():
    zero = _f("w2_weight_scale_2", "zero", (0,), role="global_scale")
    assert audit.problem_of(_report(zero), "ck", False) == (
        f"ck: backend VLLM_CUTLASS reads tensors that were loaded with unusable values: {EXPERTS}w2_weight_scale_2 "
        "[expert 0]: zero")
    hole = _f("w2_weight_scale", "unloaded", (1,), role="block_scale")
    assert audit.problem_of(_report(hole, zero), "ck", False).startswith(
        f"ck: backend VLLM_CUTLASS reads tensors that were never loaded or hold unusable values: {EXPERTS}"
        f"w2_weight_scale [expert 1]: unloaded; {EXPERTS}w2_weight_scale_2 [expert 0]: zero")


def test_expected_kinds_pass_exactly_and_a_missing_kind_is_named():
    zero = _f("w2_weight_scale_2", "zero", (0,), role="global_scale")
    assert audit.problem_of(_report(zero), "ck", False, ["zero"]) is None
    problem = audit.problem_of(_report(zero), "ck", False, ["zero", "nonfinite", "refused"])
    assert problem.endswith("[expert 0]: zero [the matrix also expected: nonfinite, refused]")
    hole = _f("w2_input_scale", "unloaded", (1,))
    assert "also expected" not in audit.problem_of(_report(zero, hole), "ck", False, ["zero"])


# pinned expectations: the same matching as the lint's (checks.expected), on the checkpoint's names
PLANTED = (_f("w2_weight_scale_2", "zero", (0,), role="global_scale"),
           _f("w2_input_scale", "nonfinite", (1,), detail="1 inf"),
           Finding("model.layers.1.mlp.experts.routed_experts.w13_weight_scale", "block_scale", "nonfinite", (2,),
                   True, "256 NaN"))
PINS = (TensorFinding("zero", "model.layers.0.mlp.experts.0.down_proj.weight_scale_2"),
        TensorFinding("nonfinite", "model.layers.0.mlp.experts.1.down_proj.input_scale"),
        TensorFinding("nonfinite", "model.layers.1.mlp.experts.2.up_proj.weight_scale"))


def test_each_pin_must_be_found_on_its_tensor_while_kinds_alone_miss_a_lost_fault():
    assert audit.problem_of(_report(*PLANTED), "ck", False, PINS) is None
    lost = _report(PLANTED[0], PLANTED[2])
    assert audit.problem_of(lost, "ck", False, ("zero", "nonfinite")) is None  # the coarse verdict misses it
    assert audit.problem_of(lost, "ck", False, PINS).endswith(
        "[the matrix also expected: nonfinite on model.layers.0.mlp.experts.1.down_proj.input_scale]")


def test_a_fault_on_another_expert_or_of_another_kind_does_not_meet_its_pin():
    moved = _f("w2_weight_scale_2", "zero", (1,), role="global_scale")
    problem = audit.problem_of(_report(moved, *PLANTED[1:]), "ck", False, PINS)
    assert problem.endswith("[the matrix also expected: zero on model.layers.0.mlp.experts.0.down_proj."
                            "weight_scale_2]")
    other = _f("w2_weight_scale_2", "negative", (0,), role="global_scale")
    assert "also expected: zero on" in audit.problem_of(_report(other, *PLANTED[1:]), "ck", False, PINS)


def test_a_finding_no_pin_or_code_accounts_for_fails_even_when_every_pin_is_met():
    extra = _f("w13_input_scale", "unloaded", (3,))
    problem = audit.problem_of(_report(*PLANTED, extra), "ck", False, PINS)
    assert "w13_input_scale [expert 3]: unloaded" in problem and "also expected" not in problem
    assert audit.problem_of(_report(*PLANTED, extra), "ck", False, (*PINS, "unloaded")) is None


def test_a_glob_pin_covers_every_finding_it_names_and_a_pin_may_name_the_fused_parameter():
    holes = (_f("w13_input_scale", "unloaded", (3,)), _f("w2_input_scale", "unloaded", (3,)))
    assert audit.problem_of(_report(*holes), "ck", False,
                            [TensorFinding("unloaded", "model.layers.0.mlp.experts.3.*.input_scale")]) is None
    assert audit.problem_of(_report(*holes), "ck", False,
                            [TensorFinding("unloaded", "model.layers.0.mlp.experts.3.up_proj.input_scale")])
    varies = _f("w13_input_scale", "nonfinite")
    assert audit.problem_of(_report(varies), "ck", False, [TensorFinding("nonfinite", "*.w13_input_scale")]) is None


# ------------------------------------------------------------------------------------------ audit_verdict


def _build(backend: str = "VLLM_CUTLASS") -> LayerBuild:
    layer = MoELayer(None, None, "model.layers.0.mlp.", "ModelOptNvFp4FusedMoE", backend, False, None, 4)
    return LayerBuild(layer, None)


def test_no_layer_is_a_skip_when_the_matrix_expects_a_refusal_else_a_failure(matrix):
    rejected = case_for(matrix, "qwen3moe-tiny-nvfp4-w4a16-legacy", "post_load_audit")
    v = audit.audit_verdict(rejected, LayerBuild(None, "ValueError: no"), matrix.moe_backends, None)
    assert v.problem is None and v.reason.startswith("vLLM refuses this config, as the matrix expects")
    sound = case_for(matrix, "qwen3moe-tiny-nvfp4-w4a4", "post_load_audit")
    v = audit.audit_verdict(sound, LayerBuild(None, "ValueError: no"), matrix.moe_backends, None)
    assert v.message == ("qwen3moe-tiny-nvfp4-w4a4@sm121-default post_load_audit: no MoE layer to audit: vLLM "
                         "refused to build it (ValueError: no)") and v.reason is None


def test_an_undescribed_backend_or_a_missing_report_fails(matrix):
    case = case_for(matrix, "qwen3moe-tiny-nvfp4-w4a4", "post_load_audit")
    for build, report in ((_build("NEW"), _report()), (_build(), None)):
        problem = audit.audit_verdict(case, build, matrix.moe_backends, report).problem
        assert problem == (f"backend {build.layer.backend} is not described under moe_backends, so what it reads "
                           "is unknown")


def test_the_verdict_judges_against_the_matrix_expectation_for_the_arch_and_records_notes(matrix):
    ck = "qwen3moe-tiny-nvfp4-w4a4-bad-scale-values"
    notes = (_f("w13_input_scale", "unloaded", (0, 1), read=False), _f("w2_input_scale", "varies", detail="x"),
             _f("w2_input_scale", "unloaded", (1,), read=False), _f("w13_input_scale", "varies"))
    v = audit.audit_verdict(case_for(matrix, ck, "post_load_audit"), _build(), matrix.moe_backends,
                            _report(*PLANTED, *notes))
    assert v.problem is None
    assert v.properties == ((P.MOE_BACKEND, "VLLM_CUTLASS"),
                            (P.UNLOADED_UNREAD, f"{notes[0].describe()}; {notes[2].describe()}"),
                            (P.AUDIT_NOTES, f"{notes[1].describe()}; {notes[3].describe()}"))
    sm90 = audit.audit_verdict(case_for(matrix, ck, "post_load_audit", "sm90"), _build("MARLIN"),
                               matrix.moe_backends, _report(*PLANTED))
    # Marlin reads no input_scale: that finding is not expected
    assert "nonfinite" in sm90.problem and sm90.message.startswith(
        f"{ck}@sm90-default post_load_audit: modelopt nvfp4_w4a4 on sm90")
    weight_only = audit.audit_verdict(case_for(matrix, "qwen3moe-tiny-nvfp4-weight-only", "post_load_audit"),
                                      _build(), matrix.moe_backends, _report(_f("w2_input_scale", "unloaded", (0,))))
    assert "weight-only checkpoint routed to a W4A4 fused-MoE backend" in weight_only.problem


# ------------------------------------------------------------------------------------------ findings: rows, finiteness


def test_expert_rows_only_for_expert_indexed_masks():
    assert findings.expert_rows(torch.tensor(True), 4) == ()
    assert findings.expert_rows(torch.ones(3, 2, dtype=torch.bool), 4) == ()
    mask = torch.zeros(4, 2, 3, dtype=torch.bool)
    mask[1, 1, 2] = mask[3, 0, 0] = True
    assert findings.expert_rows(mask, 4) == (1, 3)
    assert findings.expert_rows(torch.tensor([True]), 1) == (0,)  # a single expert row


def test_all_finite_scalar_small_and_chunked(monkeypatch):
    assert findings.all_finite(torch.tensor(1.0)) and not findings.all_finite(torch.tensor(float("inf")))
    t = torch.ones(6, 4)
    assert findings.all_finite(t)
    monkeypatch.setattr(findings, "_CHUNK", 8)  # two rows per pass
    assert findings.all_finite(t)
    for row in range(6):
        bad = t.clone()
        bad[row, 3] = float("nan")
        assert not findings.all_finite(bad), row
    monkeypatch.setattr(findings, "_CHUNK", 2)  # a row larger than a chunk: one row per pass
    assert findings.all_finite(t)
    t[5, 0] = float("-inf")
    assert not findings.all_finite(t)
    monkeypatch.setattr(findings, "_CHUNK", 24)  # exactly one chunk
    assert not findings.all_finite(t)


def test_all_finite_passes_over_the_fewest_chunks_of_at_most_a_chunk_or_one_row(monkeypatch):
    """The chunking bounds the transient mask (a large expert tensor never needs a full-size one): each pass
    covers whole dim-0 rows, as many as fit in _CHUNK elements, at least one."""
    isfinite, sizes = torch.isfinite, []

    def recorded(t: torch.Tensor) -> torch.Tensor:
        sizes.append(tuple(t.shape))
        return isfinite(t)

    monkeypatch.setattr(findings, "_CHUNK", 8)
    monkeypatch.setattr(torch, "isfinite", recorded)
    for shape, passes in (((20,), [(8,), (8,), (4,)]), ((3, 4), [(2, 4), (1, 4)]), ((2, 4), [(2, 4)]),
                          ((3, 20), [(1, 20)] * 3), ((1, 20), [(1, 20)]), ((0, 4), [(0, 4)]), ((), [()])):
        sizes.clear()
        assert findings.all_finite(torch.ones(shape)), shape
        assert sizes == passes, shape


def test_nonfinite_detail_counts_nan_and_inf():
    v = torch.tensor([float("nan"), float("inf"), float("-inf"), 1.0])
    assert findings._nonfinite_detail(v, ~torch.isfinite(v)) == "1 NaN, 2 inf"
    assert findings._nonfinite_detail(v, torch.tensor([True, False, False, False])) == "1 NaN"
    assert findings._nonfinite_detail(v, torch.tensor([False, False, True, False])) == "1 inf"


# ------------------------------------------------------------------------------------------ findings: judge_layer


def _judge(params: dict[str, torch.Tensor], unloaded: dict[str, torch.Tensor] | None = None,
           reads: frozenset[str] = READS, single: bool = False, n: int = 2, extra=()) -> AuditReport:
    unloaded = unloaded if unloaded is not None else {k: torch.zeros_like(v, dtype=torch.bool)
                                                      for k, v in params.items()}
    return findings.measure_layer({EXPERTS + k: v for k, v in params.items()},
                                {EXPERTS + k: v for k, v in unloaded.items()}, "B", reads, single, n, extra)


def test_a_sound_layer_has_no_findings_and_every_parameter_loaded():
    r = _judge({"w13_weight": torch.zeros(2, 4, dtype=torch.uint8), "w13_weight_scale": torch.ones(2, 4),
                "w13_input_scale": torch.ones(2)})
    assert r.findings == () and r.backend == "B" and r.reads == READS
    assert r.loaded == {EXPERTS + "w13_weight", EXPERTS + "w13_weight_scale", EXPERTS + "w13_input_scale"}


def test_a_rank_parameter_indexed_by_global_expert_names_its_rows_by_global_expert():
    """Under expert parallelism FlashInfer's NVFP4 input scales hold every expert on each rank (2 local of 4)."""
    scale = torch.ones(4, 2)
    scale[3, 1] = float("nan")
    hole = torch.zeros(4, 2, dtype=torch.bool)
    hole[3] = True
    r = findings.measure_layer({EXPERTS + "w13_input_scale": scale}, {EXPERTS + "w13_input_scale": hole}, "B",
                               READS, False, 2, (), global_experts=4)
    assert [(f.kind, f.experts, f.detail) for f in r.findings] == [("unloaded", (3,), "2/8 elements")]
    scale[3, 1], hole[3] = 1.0, False
    hole[1] = True
    local = findings.measure_layer({EXPERTS + "w13_input_scale": scale}, {EXPERTS + "w13_input_scale": hole}, "B",
                                   READS, False, 2, ())
    assert [f.experts for f in local.findings] == [()]  # without the global count: no row to name


def test_unloaded_share_per_element_per_expert_row_or_whole():
    p = torch.ones(2, 3)
    elements = torch.tensor([[False, True, True], [False, False, False]])
    rows = torch.tensor([[True], [False]])
    r = _judge({"w2_weight_scale": p, "w13_weight_scale": p, "w2_input_scale": torch.ones(2)},
               {"w2_weight_scale": elements, "w13_weight_scale": rows, "w2_input_scale": torch.tensor(True)})
    assert r.findings == (
        Finding(EXPERTS + "w2_weight_scale", "block_scale", "unloaded", (0,), True, "2/6 elements"),
        Finding(EXPERTS + "w13_weight_scale", "block_scale", "unloaded", (0,), True, "1/2 experts"),
        Finding(EXPERTS + "w2_input_scale", "input_scale", "unloaded", (), True, "not written"))
    assert r.loaded == {EXPERTS + "w2_weight_scale", EXPERTS + "w13_weight_scale"}  # wholly unloaded: not loaded


def test_unloaded_records_whether_the_backend_reads_it_and_extra_findings_come_first():
    refused = Finding("model.layers.0.mlp.experts.1.gate_proj.input_global_scale", "input_scale", "refused", (),
                      True, "RuntimeError")
    r = _judge({"w2_input_scale": torch.ones(2)}, {"w2_input_scale": torch.tensor([True, True])},
               reads=frozenset({"weight"}), extra=[refused])
    assert r.findings == (refused, Finding(EXPERTS + "w2_input_scale", "input_scale", "unloaded", (0, 1), False,
                                           "2/2 elements"))


@pytest.mark.parametrize("value, kinds", [
    (0.0, ["zero"]), (-0.0, ["zero"]), (-1e-30, ["negative"]), (1e-30, []), (float("nan"), ["nonfinite"]),
    (float("inf"), ["nonfinite"]), (float("-inf"), ["nonfinite", "negative"])])
def test_scale_thresholds_at_their_boundaries(value, kinds):
    """Zero and negative global / input scales are unusable, a tiny positive one is not; a zero block scale may
    be an all-zero block, but a negative or non-finite one never is."""
    for leaf, role in (("w2_weight_scale_2", "global_scale"), ("w2_input_scale", "input_scale"),
                       ("w2_weight_scale", "block_scale")):
        p = torch.tensor([1.0, value])
        got = [(f.kind, f.experts, f.role, f.detail) for f in _judge({leaf: p}).findings]
        want = [k for k in kinds if not (role == "block_scale" and k == "zero")]
        counted = "1 NaN" if value != value else "1 inf"  # only a non-finite finding counts its values
        assert got == [(k, (1,), role, counted if k == "nonfinite" else "") for k in want], (leaf, value)


def test_bad_scale_values_in_unloaded_elements_are_holes_not_values():
    p = torch.tensor([float("nan"), 0.0])
    r = _judge({"w2_weight_scale_2": p}, {"w2_weight_scale_2": torch.tensor([True, True])})
    assert [f.kind for f in r.findings] == ["unloaded"]


def test_nonfinite_scale_detail():
    r = _judge({"w2_weight_scale_2": torch.tensor([float("nan"), float("inf")])})
    assert r.findings == (Finding(EXPERTS + "w2_weight_scale_2", "global_scale", "nonfinite", (0, 1), True,
                                  "1 NaN, 1 inf"),)


def test_fp8_block_scales_are_judged_as_floats():
    p = torch.tensor([[1.0, -2.0], [1.0, 1.0]]).to(torch.float8_e4m3fn)
    assert [(f.kind, f.experts) for f in _judge({"w13_weight_scale": p}).findings] == [("negative", (0,))]


def test_varies_only_for_a_read_single_value_input_scale_loaded_everywhere():
    spread = {"w13_input_scale": torch.tensor([0.5, 1.0])}
    (f,) = _judge(spread, single=True).findings
    assert f == Finding(EXPERTS + "w13_input_scale", "input_scale", "varies", (), True,
                        "0.5..1 across experts; the backend takes one value per layer (vLLM uses the max)")
    assert _judge(spread, single=False).findings == ()
    assert _judge(spread, single=True, reads=frozenset({"weight"})).findings == ()
    assert _judge({"w13_input_scale": torch.tensor([0.5, 0.5])}, single=True).findings == ()
    assert _judge({"w13_weight_scale_2": torch.tensor([0.5, 1.0])}, single=True).findings == ()
    partly = _judge(spread, {"w13_input_scale": torch.tensor([False, True])}, single=True)
    assert [f.kind for f in partly.findings] == ["unloaded"]
    nan = _judge({"w13_input_scale": torch.tensor([0.5, float("nan"), 0.5])}, single=True, n=3)
    assert [f.kind for f in nan.findings] == ["nonfinite"]  # non-finite values leave the spread out
    all_nan = _judge({"w13_input_scale": torch.tensor([float("nan")])}, single=True, n=1)
    assert [f.kind for f in all_nan.findings] == ["nonfinite"]
    inf_spread = _judge({"w13_input_scale": torch.tensor([0.25, float("inf"), 4.0])}, single=True, n=3)
    assert [f.detail for f in inf_spread.findings][-1].startswith("0.25..4 across experts")


def test_nonfinite_weights_are_found_only_where_loaded_and_packed_weights_are_not_judged():
    w = torch.ones(2, 3, dtype=torch.bfloat16)
    w[1, 2] = float("nan")
    w[0, 0] = float("inf")
    (f,) = _judge({"w13_weight": w}).findings
    assert f == Finding(EXPERTS + "w13_weight", "weight", "nonfinite", (0, 1), True, "1 NaN, 1 inf")
    only_unloaded = torch.tensor([[True, False, False], [False, False, True]])
    r = _judge({"w13_weight": w}, {"w13_weight": only_unloaded})
    assert [f.kind for f in r.findings] == ["unloaded"]
    half = _judge({"w13_weight": w}, {"w13_weight": torch.tensor([[True, False, False], [False, False, False]])})
    assert [(f.kind, f.experts) for f in half.findings] == [("unloaded", (0,)), ("nonfinite", (1,))]
    packed = torch.full((2, 3), 255, dtype=torch.uint8)
    assert _judge({"w13_weight": packed}).findings == ()
    bias = torch.tensor([float("nan"), 0.0, -1.0])
    # a bias (or router weight) is read by every forward: a NaN in one is found (issue 31: it once passed), and a
    # negative or zero value, which a bias may hold, is not
    assert _judge({"bias": bias}, n=3).findings == (
        Finding(EXPERTS + "bias", "other", "nonfinite", (0,), True, "1 NaN"),)
    assert _judge({"bias": torch.tensor([0.0, -1.0, 2.0])}, n=3).findings == ()
