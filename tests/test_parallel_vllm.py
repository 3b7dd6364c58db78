"""Parallel layouts against the installed vLLM, through the real cpu tier: each hand-made sharding bug of
tests/shard_bugs.py, installed in a child pytest (and the rank processes it starts), turns its checkpoint's
rank_shards case red, named by rank, tensor, expert and slice, while a checkpoint vLLM loads unchanged in the same
run stays green; and the rank processes fail loudly and start afresh."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import shard_bugs
import vllm_patch

from quantmatrix.checkpoints import store
from quantmatrix.checks import ranks as rank_checks
from quantmatrix.checks.verdict import FAIL
from quantmatrix.measure import pool, ranked, shards, split
from quantmatrix.schema.layouts import Layout
from quantmatrix.schema.load import load
from quantmatrix.schema.model import Case, Cell

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = load(ROOT / "matrices" / "default.yaml")
FUSED = "model.layers.0.mlp.experts.routed_experts"
EXPERTS = "model.layers.0.mlp.experts"
# case -> the bug its checkpoint carries in the child run (None: vLLM unchanged)
CASES = {
    "qwen3moe-tiny-ct-nvfp4-w4a4@sm121-default-tp2": "block_scale_input_dim",
    "qwen3moe-tiny-nvfp4-weight-only@sm121-default-tp2": "gate_up_swapped_odd_ranks",
    "qwen3moe-tiny-nvfp4-weight-only@sm121-default-tp4": "gate_up_swapped_odd_ranks",
    "qwen3moe-tiny-nvfp4-w4a4@sm121-default-tp2_ep": "input_scale_every_rank",
    "qwen3moe-tiny-ct-nvfp4a16@sm121-default-tp2": None,
}


def _checkpoint(checkpoint_id: str):
    return next(c for c in DEFAULT.checkpoints if c.id == checkpoint_id)


@pytest.fixture(scope="module")
def bugged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """One child pytest over the cpu tier's rank_shards cases above, each checkpoint carrying its own bug:
    case -> (outcome, message). The checkpoints come from the default cache, as tests/test_engine.py's do."""
    tmp = tmp_path_factory.mktemp("bugs")
    bugs = {store.materialize(_checkpoint(case.split("@")[0])): bug for case, bug in CASES.items() if bug}
    env = {**os.environ, **shard_bugs.install(tmp, bugs)}
    nodes = [f"suites/test_layers.py::test_rank_shards[{case}]" for case in CASES]
    out = vllm_patch.child_pytest(tmp, nodes, env)
    return {node.split("[", 1)[1].removesuffix("]"): result for node, result in out.items()}


def test_an_unchanged_vllm_loads_the_control_checkpoint_green_in_the_same_run(bugged):
    assert bugged["qwen3moe-tiny-ct-nvfp4a16@sm121-default-tp2"] == ("passed", "")


def test_a_w13_block_scale_sharded_along_the_input_dim_is_red_on_every_rank(bugged):
    outcome, message = bugged["qwen3moe-tiny-ct-nvfp4-w4a4@sm121-default-tp2"]
    assert outcome == "failed"
    # 2 ranks x 2 layers x 4 experts x (gate, up): every w13 block-scale slot, nothing else
    assert message.startswith("qwen3moe-tiny-ct-nvfp4-w4a4@sm121-default-tp2 rank_shards: 32 slot(s) under layout "
                              "tp2 differ from the reference split of the checkpoint's files: "), message
    assert (f"rank 0 {FUSED}.w13_weight_scale (expert 0) [0:32, 0:4] must hold {EXPERTS}.0.gate_proj.weight_scale"
            "[0:32, 0:4]: wrong (holds other data)") in message
    assert (f"rank 0 {FUSED}.w13_weight_scale (expert 0) [32:64, 0:4] must hold {EXPERTS}.0.up_proj.weight_scale"
            "[0:32, 0:4]: wrong (holds other data)") in message
    assert message.count(": wrong") == 8 and message.endswith("; and 24 more")


@pytest.mark.parametrize("layout, odd", [("tp2", (1,)), ("tp4", (1, 3))])
def test_gate_and_up_swapped_on_odd_ranks_is_red_naming_those_ranks(bugged, layout, odd):
    outcome, message = bugged[f"qwen3moe-tiny-nvfp4-weight-only@sm121-default-{layout}"]
    assert outcome == "failed"
    tp = int(layout[2:])
    n = 64 // tp
    r = odd[0]
    assert (f"rank {r} {FUSED}.w13_weight (expert 0) [0:{n}, 0:32] must hold {EXPERTS}.0.gate_proj.weight"
            f"[{r * n}:{(r + 1) * n}, 0:32]: wrong (holds {EXPERTS}.0.up_proj.weight[{r * n}:{(r + 1) * n}, 0:32] "
            f"(rank {r}'s part) instead)") in message, message
    assert "rank 0 " not in message and "rank 2 " not in message


def test_a_per_expert_input_scale_loaded_on_a_rank_that_does_not_own_it_is_red(bugged):
    outcome, message = bugged["qwen3moe-tiny-nvfp4-w4a4@sm121-default-tp2_ep"]
    assert outcome == "failed"
    assert (f"rank 0 {FUSED}.w13_input_scale (expert 2) [1]: owner (its weight loader wrote expert 2, which rank 0 "
            "does not hold, into row 1 (expert 1))") in message, message


def test_the_rank_processes_fail_loudly_and_start_afresh(tmp_path):
    """A job the ranks cannot measure (a safetensors file that lies about its header) is a RankFailure with the
    rank's traceback; the next job gets new ranks."""
    archs = (("sm121", DEFAULT.arch("sm121").capability),)
    backends = {n: (tuple(sorted(b.reads)), b.single_input_scale) for n, b in DEFAULT.moe_backends.items()}
    ranks = pool.Pool()
    try:
        (tmp_path / "model.safetensors").write_bytes(b"\xff" * 64)
        with pytest.raises(pool.RankFailure, match=r"(?s)rank 0 of tp2: Traceback.*LintError: .*model.safetensors: "
                                                   r"header length \d+ exceeds the file"):
            ranks.run(ranked.Job(str(tmp_path), 2, False, archs, backends))
        good = store.materialize(_checkpoint("qwen3moe-tiny-nvfp4-weight-only"))
        results = ranks.run(ranked.Job(str(good), 2, False, archs, backends))
        assert [r.facts.tp_rank for r in results] == [0, 1] and all(r.compared > 0 for r in results)
        assert ranks.jobs == 1 and ranks.ranks_built == 2
    finally:
        ranks.close()
    assert ranks.log.is_file()


def test_vllm_loads_a_layout_that_splits_nvfp4_groups_silently_and_rank_shards_is_red():
    """Measured on the installed vLLM: its MixtralMoE (unlike Qwen3-MoE, which refuses more ranks than experts) takes
    tp 8 for the tiny Mixtral, whose 64 intermediate values cannot split into whole 16-value NVFP4 groups over 8
    ranks. It neither refuses nor pads: each rank's w2 holds 4 packed bytes (8 values, half a group) and its w2
    block scale no column at all. rank_shards names the layout's reason, rank, tensor, expert and slice; the
    one-rank checks see nothing wrong. Built in the real rank processes, judged as the cpu tier judges."""
    ck = _checkpoint("mixtral-tiny-nvfp4-weight-only")
    path = store.materialize(ck)
    archs = (("sm121", DEFAULT.arch("sm121").capability),)
    backends = {n: (tuple(sorted(b.reads)), b.single_input_scale) for n, b in DEFAULT.moe_backends.items()}
    ranks = pool.Pool()
    try:
        results = ranks.run(ranked.Job(str(path), 8, False, archs, backends))
    finally:
        ranks.close()
    assert [r.facts.tp_size for r in results] == [8] * 8  # every rank built its block: none refused
    assert not [a.error for r in results for a in r.archs.values() if a.error]
    why = split.impossible(split.Checkpoint(path), shards.moe_ranks(8, False))
    experts = "model.layers.0.block_sparse_moe.experts"
    assert why == f"{experts}.*.w2.weight [64, 32]: 32 along axis 1 (4 blocks of 8) cannot be split evenly over 8 ranks"
    cell = Cell(ck, DEFAULT.arch("sm121"), DEFAULT.mode("default"), Layout(8))
    case = Case(DEFAULT.checks["rank_shards"], cell, None)
    verdict = rank_checks.shards_verdict(case, ranked.combine(results, 8, False, "sm121", why))
    assert verdict.outcome == FAIL and verdict.heading == "mixtral-tiny-nvfp4-weight-only@sm121-default-tp8 rank_shards"
    # 8 ranks x 4 experts x (w2 weight, w2 block scale): every slot of the split axis, nothing else
    assert verdict.problem.startswith("64 slot(s) under layout tp8 differ from the reference split of the "
                                      f"checkpoint's files (a layout that cannot split exactly: {why}): "), \
        verdict.problem
    assert (f"rank 0 {experts}.routed_experts.w2_weight (expert 0) must hold {experts}.0.w2.weight: shape (axis 1 "
            "slot holds 4, its part is 8 of 32)") in verdict.problem
    assert (f"rank 0 {experts}.routed_experts.w2_weight_scale (expert 0) must hold {experts}.0.w2.weight_scale: "
            "shape (axis 1 slot holds 0, its part is 1 of 4)") in verdict.problem
