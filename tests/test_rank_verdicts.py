"""checks.ranks on hand-made rank measurements (measure.ranked): every branch of the per-rank layer checks and of
rank_shards, and its words. Fast: no torch, no vLLM (the real ranks are in tests/test_parallel_vllm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantmatrix import properties as P
from quantmatrix.adapter.kernel import KernelFormat
from quantmatrix.adapter.parallel import RankFacts
from quantmatrix.checks import ranks
from quantmatrix.checks.verdict import FAIL, OK, SKIP
from quantmatrix.measure.loaded import AuditReport, Finding
from quantmatrix.measure.ranked import ArchResult, Ranked, RankResult, ShardFinding, combine
from quantmatrix.schema.load import load
from quantmatrix.schema.model import Case, Cell, Layout

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = load(ROOT / "matrices" / "default.yaml")
FUSED = "model.layers.1.mlp.experts.routed_experts"
TP2 = Layout(2, False)
IMPOSSIBLE = "model.layers.0.mlp.experts.*.down_proj.weight_scale [64, 4]: cannot be split evenly over 8 ranks"


def _case(check: str, checkpoint: str = "qwen3moe-tiny-nvfp4-w4a4", layout: Layout = TP2) -> Case:
    ck = next(c for c in DEFAULT.checkpoints if c.id == checkpoint)
    return Case(DEFAULT.checks[check], Cell(ck, DEFAULT.arch("sm121"), DEFAULT.mode("default"), layout), None)


def _rank(rank: int, backend: str = "VLLM_CUTLASS", error: str | None = None, audit: AuditReport | None = None,
          kernel: KernelFormat | None = None, experts: tuple[int, ...] = (0, 1, 2, 3), **kw: object) -> RankResult:
    arch = ArchResult("ModelOptNvFp4FusedMoE", backend, False, error, (), audit, kernel)
    facts = None if error else RankFacts(rank, 2, 0, 1, experts, 4)
    return RankResult(rank, facts, {"sm121": arch}, **kw)  # type: ignore[arg-type]


def _ranked(*results: RankResult, impossible: str | None = None, tp: int = 2, ep: bool = False) -> Ranked:
    return combine(list(results), tp, ep, "sm121", impossible)


def test_by_rank_keeps_one_value_and_groups_the_ranks_that_share_one():
    assert ranks._by_rank({0: "a", 1: "a"}, (0, 1)) == "a"
    assert ranks._by_rank({0: "a", 1: "b", 2: "a"}, (0, 1, 2)) == "ranks 0,2: a; rank 1: b"
    assert ranks._by_rank({1: "a"}, (0, 1)) == "rank 1: a"  # one rank of two: named


def test_layer_dispatch_on_every_rank_merges_properties_and_names_the_rank_that_differs():
    ok = ranks.layer_verdict(_case("layer_dispatch"), _ranked(_rank(0), _rank(1)), DEFAULT.moe_backends)
    assert ok.outcome == OK and (P.MOE_BACKEND, "VLLM_CUTLASS") in ok.properties
    bad = ranks.layer_verdict(_case("layer_dispatch"), _ranked(_rank(0), _rank(1, "MARLIN")), DEFAULT.moe_backends)
    assert bad.outcome == FAIL
    assert bad.problem.startswith("rank 1: W4A4 checkpoint routed to MARLIN on sm121 (GB10 / DGX Spark), which never "
                                  "reads activation scales")
    assert (P.MOE_BACKEND, "rank 0: VLLM_CUTLASS; rank 1: MARLIN") in bad.properties


def test_an_impossible_layout_refused_is_skipped_and_a_possible_one_refused_fails():
    refused = _ranked(_rank(0, error="ValueError: too many ranks"), _rank(1, error="ValueError: too many ranks"),
                      impossible=IMPOSSIBLE, tp=8)
    skip = ranks.layer_verdict(_case("layer_dispatch", layout=Layout(8)), refused, DEFAULT.moe_backends)
    assert skip.outcome == SKIP and skip.reason == (f"vLLM refuses layout tp8, as it must ({IMPOSSIBLE}): "
                                                    "ValueError: too many ranks")
    assert (P.LAYOUT_REFUSED, "ValueError: too many ranks") in skip.properties
    assert ranks.audit_verdict(_case("post_load_audit", layout=Layout(8)), refused, DEFAULT.moe_backends,
                               None).outcome == SKIP
    shards = ranks.shards_verdict(_case("rank_shards", layout=Layout(8)), refused)
    assert shards.outcome == OK and (P.LAYOUT_REFUSED, "ValueError: too many ranks") in shards.properties
    possible = _ranked(_rank(0), _rank(1, error="RuntimeError: gloo"))
    fail = ranks.shards_verdict(_case("rank_shards"), possible)
    assert fail.outcome == FAIL and fail.problem == ("vLLM refused layout tp2, which splits qwen3moe-tiny-nvfp4-w4a4 "
                                                     "exactly: rank 1: RuntimeError: gloo")
    assert ranks.layer_verdict(_case("layer_dispatch"), possible, DEFAULT.moe_backends).problem.startswith(
        "rank 1: vLLM could not build the MoE layer on sm121 (GB10 / DGX Spark): RuntimeError: gloo")
    rejected = ranks.shards_verdict(_case("rank_shards", "qwen3moe-tiny-nvfp4-w4a16-legacy"), refused)
    assert rejected.outcome == SKIP and "as the matrix expects" in rejected.reason


def test_the_audit_judges_every_rank_as_one_report():
    """Under expert parallel the expert with the hole is on one rank: the union matches the matrix's pin."""
    hole = Finding(f"{FUSED}.w13_input_scale", "input_scale", "unloaded", (3,), True, "2/4 elements", rank=1)
    clean = AuditReport("VLLM_CUTLASS", frozenset({"input_scale"}), (), frozenset())
    ranked = _ranked(_rank(0, audit=clean, experts=(0, 1)), _rank(1, audit=AuditReport(
        "VLLM_CUTLASS", frozenset({"input_scale"}), (hole,), frozenset()), experts=(2, 3)), ep=True)
    case = _case("post_load_audit", "qwen3moe-tiny-nvfp4-w4a4-expert-missing-input-scale", Layout(2, True))
    assert ranks.audit_verdict(case, ranked, DEFAULT.moe_backends, ranked.audit).outcome == OK
    bad = ranks.audit_verdict(_case("post_load_audit"), ranked, DEFAULT.moe_backends, ranked.audit)
    assert bad.outcome == FAIL and f"rank 1 {FUSED}.w13_input_scale [expert 3]: unloaded (2/4 elements)" in bad.problem
    unknown = _ranked(_rank(0, audit=None), _rank(1, audit=clean))
    assert unknown.audit is None


def test_kernel_format_on_every_rank():
    needs = KernelFormat("conversion needs CUDA")
    ranked = _ranked(_rank(0, kernel=needs), _rank(1, kernel=needs))
    skip = ranks.kernel_verdict(_case("kernel_format"), ranked, DEFAULT.moe_backends, ranked.kernels)
    assert skip.outcome == SKIP and skip.reason == "conversion needs CUDA"
    good = KernelFormat(None, "FusedMoEQuantConfig", {"g1_alphas": True, "g2_alphas": True}, ("a1_gscale",
                                                                                             "a2_gscale"))
    bad = KernelFormat(None, "FusedMoEQuantConfig", {"g1_alphas": False, "g2_alphas": True}, ("a1_gscale",
                                                                                             "a2_gscale"))
    ranked = _ranked(_rank(0, kernel=good), _rank(1, kernel=bad))
    fail = ranks.kernel_verdict(_case("kernel_format"), ranked, DEFAULT.moe_backends, ranked.kernels)
    assert fail.outcome == FAIL and fail.problem.startswith("rank 1: backend VLLM_CUTLASS on sm121 (GB10 / DGX "
                                                            "Spark): g1_alphas hold non-finite values")


def _wrong(rank: int, expert: int) -> ShardFinding:
    return ShardFinding(rank, f"{FUSED}.w13_weight", "wrong", expert, "[0:32, 0:32]", "x.weight[32:64, 0:32]",
                        "holds other data")


@pytest.mark.parametrize("impossible", [None, IMPOSSIBLE])
def test_rank_shards_names_the_first_slots_and_counts_the_rest(impossible):
    bad = [_wrong(1, e) for e in range(4)] * 3
    ranked = _ranked(_rank(0, compared=10), _rank(1, compared=10, shards=tuple(bad)), impossible=impossible)
    v = ranks.shards_verdict(_case("rank_shards"), ranked)
    assert v.outcome == FAIL
    why = f" (a layout that cannot split exactly: {impossible})" if impossible else ""
    assert v.problem.startswith(f"12 slot(s) under layout tp2 differ from the reference split of the checkpoint's "
                                f"files{why}: rank 1 {FUSED}.w13_weight (expert 0) [0:32, 0:32] must hold "
                                "x.weight[32:64, 0:32]: wrong (holds other data); ")
    assert v.problem.endswith("; and 4 more") and v.problem.count(": wrong") == 8


def test_rank_shards_passes_with_its_facts_and_notes_and_fails_when_nothing_was_compared():
    note = ShardFinding(0, f"{FUSED}.w13_g_idx", "unplaced", 0, detail="a [64] tensor into a row of shape [2, 2]")
    ranked = _ranked(_rank(0, compared=98, shards=(note,), note="heads"), _rank(1, compared=98, experts=(0, 1, 2, 3)))
    v = ranks.shards_verdict(_case("rank_shards"), ranked)
    assert v.outcome == OK
    assert dict(v.properties) == {P.LAYOUT_NOTE: "heads", P.EXPERT_PLACEMENT: "rank 0: 0-3; rank 1: 0-3",
                                  P.SHARDS_COMPARED: 196, P.SHARD_NOTES: note.describe()}
    empty = ranks.shards_verdict(_case("rank_shards"), _ranked(_rank(0), _rank(1)))
    assert empty.outcome == FAIL and empty.problem.startswith("no slot of any rank under layout tp2 could be compared")


def test_an_expert_on_two_ranks_fails_rank_shards():
    ranked = _ranked(_rank(0, experts=(0, 1), compared=5), _rank(1, experts=(1, 2), compared=5), ep=True)
    v = ranks.shards_verdict(_case("rank_shards", layout=Layout(2, True)), ranked)
    assert v.outcome == FAIL and "rank 0 (expert map) (expert 1): owner (on rank(s) 0, 1; the layout puts it on 1 " \
                                 "rank(s))" in v.problem
    assert "(expert 3): owner (on rank(s) none" in v.problem
