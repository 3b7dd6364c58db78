"""The reference split (measure.split) and a rank's tensors against it (measure.shards), on hand-made tensors: the
rule (column-parallel gate and up, row-parallel down, one value per projection whole, padding to whole blocks),
an impossible layout named by its tensor, and every kind of wrong slot named by rank, tensor, expert and slice
with what it holds instead. Fast: no vLLM (the real ranks are in tests/test_ranks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from quantmatrix.adapter.parallel import RankFacts
from quantmatrix.measure import ranked, shards, split
from quantmatrix.measure.split import Place, part, place

E, FFN, H = 4, 64, 32  # experts, intermediate (expert ffn), hidden
PREFIX = "model.layers.0.mlp.experts"
FUSED = f"{PREFIX}.routed_experts"
PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def test_part_is_an_exact_share_or_whole_blocks_padded():
    assert [part(64, r, 2) for r in (0, 1)] == [(0, 32, True), (32, 32, True)]
    assert part(4, 3, 8) == (3, 1, False) and part(4, 5, 8) == (4, 0, False)  # 4 blocks over 8 ranks
    # 384 values in 128-value blocks over 4 ranks: one whole block each, the last rank only padding
    assert [part(384, r, 4, unit=128)[:2] for r in range(4)] == [(0, 128), (128, 128), (256, 128), (384, 0)]
    assert part(32, 1, 8, unit=8) == (8, 8, False)  # 4 bytes a rank would split an 8-byte group


@pytest.mark.parametrize("shard, offset", [("w1", 0), ("w3", 32)])
def test_gate_and_up_are_column_parallel_in_one_fused_row(shard, offset):
    """Rank 1 of 2 holds rows 32:64 of the gate (first half of w13) and of the up (second half)."""
    where = place(shard, (FFN, H // 2), (FFN, H // 2), 1, 2, "weight")
    assert where == Place((slice(32, 64), slice(0, 16)), (slice(offset, offset + 32), slice(0, 16)))


def test_down_is_row_parallel_and_one_value_per_projection_is_whole():
    assert place("w2", (H, FFN // 16), (H, 2), 1, 2, "block_scale") == Place((slice(0, H), slice(2, 4)),
                                                                            (slice(0, H), slice(0, 2)))
    assert place("w3", (), (2,), 1, 2, "global_scale") == Place((slice(0, 1),), (slice(1, 2),), flat=True)
    assert place("w2", (1,), (), 1, 2, "input_scale") == Place((slice(0, 1),), (slice(0, 1),), flat=True)
    # a per-output-channel scale: split with the rows on gate/up, whole on down; extent 1 never splits
    assert place("w1", (FFN,), (FFN,), 1, 2, "block_scale").source == (slice(32, 64),)
    assert place("w2", (H,), (H,), 1, 2, "block_scale").source == (slice(0, H),)
    assert place("w1", (FFN, 1), (FFN, 1), 1, 2, "block_scale").source == (slice(32, 64), slice(0, 1))
    # indexed by input feature alone: whole on column-parallel ranks, split on row-parallel ones
    assert place("w1", (H,), (H,), 1, 2, "g_idx").source == (slice(0, H),)
    assert place("w2", (FFN,), (FFN // 2,), 1, 2, "g_idx").source == (slice(32, 64),)


def test_same_is_byte_exact_for_tensors_whose_size_1_dims_keep_a_stride():
    column = torch.arange(64, dtype=torch.bfloat16).reshape(1, 64).t()  # [64, 1], strides (1, 64): "contiguous"
    assert column.is_contiguous() and column.stride()[-1] != 1
    assert split.same(column, torch.arange(64, dtype=torch.float32).reshape(64, 1))
    assert not split.same(column, torch.arange(1, 65, dtype=torch.float32).reshape(64, 1))
    one = torch.arange(8, dtype=torch.bfloat16)[::2][1:2]  # one value, stride 2
    assert split.same(one, torch.tensor([2.0])) and not split.same(one, torch.tensor([3.0]))


def test_a_row_stored_transposed_and_what_no_rule_places():
    where = place("w1", (FFN, H // 8), (H // 8, FFN), 0, 2, "weight")  # int4 packed along the input, kept K-first
    assert where.transposed and where.source == (slice(0, 32), slice(0, 4))
    row = torch.arange(4 * 64).reshape(4, 64)
    assert torch.equal(where.held(row), row.t()[0:32, 0:4])
    assert place("w1", (FFN, H), (FFN, H // 2), 0, 2, "weight") == ("shape", "axis 1 holds 16, the checkpoint has 32")
    assert place("w2", (H, FFN), (H, 16), 0, 2, "weight")[0] == "shape"  # a slot half the size of its part
    assert place("w1", (2, 2, 2), (2, 2), 0, 2, "weight")[0] == "unplaced"
    assert place("w2", (), (3,), 0, 2, "global_scale") == ("unplaced", "one value into a row of shape [3]")


# ------------------------------------------------------------------------------- a hand-made checkpoint


def _tensors() -> dict[str, torch.Tensor]:
    """NVFP4-shaped experts (ModelOpt names): packed weights, 16-value block scales, global and input scales,
    every value distinct so a misplaced slice can be told apart."""
    g = torch.Generator().manual_seed(0)
    out = {f"{PREFIX[:-8]}.gate.weight": torch.randn(E, H, generator=g).to(torch.bfloat16)}
    for e in range(E):
        for shard, proj in PROJ.items():
            rows, cols = (FFN, H) if shard != "w2" else (H, FFN)
            name = f"{PREFIX}.{e}.{proj}"
            out[f"{name}.weight"] = torch.randint(0, 256, (rows, cols // 2), generator=g, dtype=torch.uint8)
            out[f"{name}.weight_scale"] = torch.rand(rows, cols // 16, generator=g).to(torch.float8_e4m3fn)
            out[f"{name}.weight_scale_2"] = torch.tensor(0.001 * (e + 1) + (shard == "w3") * 1e-4)
            out[f"{name}.input_scale"] = torch.tensor(0.01 * (e + 1))
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ck")
    save_file(_tensors(), str(path / "model.safetensors"))
    return path


def _rank_params(t: dict[str, torch.Tensor], rank: int, tp: int, experts: list[int]) -> dict[str, torch.Tensor]:
    """What a correct rank holds, written out by hand (torch.cat of the checkpoint's slices, not split.place)."""
    def rows(x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0] // tp
        return x[rank * n:(rank + 1) * n]

    def cols(x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1] // tp
        return x[:, rank * n:(rank + 1) * n]

    out = {f"{PREFIX[:-8]}.gate.weight": t[f"{PREFIX[:-8]}.gate.weight"].clone()}
    for leaf in ("weight", "weight_scale"):
        out[f"{FUSED}.w13_{leaf}"] = torch.stack([
            torch.cat([rows(t[f"{PREFIX}.{e}.gate_proj.{leaf}"]), rows(t[f"{PREFIX}.{e}.up_proj.{leaf}"])])
            for e in experts])
        out[f"{FUSED}.w2_{leaf}"] = torch.stack([cols(t[f"{PREFIX}.{e}.down_proj.{leaf}"]) for e in experts])
    for leaf in ("weight_scale_2", "input_scale"):
        out[f"{FUSED}.w13_{leaf}"] = torch.stack([torch.stack([t[f"{PREFIX}.{e}.gate_proj.{leaf}"],
                                                               t[f"{PREFIX}.{e}.up_proj.{leaf}"]]) for e in experts])
        out[f"{FUSED}.w2_{leaf}"] = torch.stack([t[f"{PREFIX}.{e}.down_proj.{leaf}"] for e in experts])
    return out


def _compare(checkpoint: Path, params: dict[str, torch.Tensor], rank: int, tp: int, ep: bool = False,
             experts: tuple[int, ...] = tuple(range(E))) -> tuple[list[ranked.ShardFinding], int]:
    facts = RankFacts(0 if ep else rank, 1 if ep else tp, rank if ep else 0, tp if ep else 1, experts, E)
    return shards.compare_rank(params, facts, rank, tp, ep, split.Checkpoint(checkpoint))


@pytest.mark.parametrize("tp, ep", [(1, False), (2, False), (4, False), (2, True)])
def test_correct_ranks_match_the_reference_everywhere(checkpoint, tp, ep):
    t = _tensors()
    for rank in range(tp):
        experts = list(range(rank * E // tp, (rank + 1) * E // tp)) if ep else list(range(E))
        found, compared = _compare(checkpoint, _rank_params(t, 0 if ep else rank, 1 if ep else tp, experts), rank,
                                   tp, ep, tuple(experts))
        assert found == [] and compared == 1 + len(experts) * 2 * (3 + 3), (tp, ep, rank)


def test_gate_and_up_swapped_on_rank_1_are_named_with_what_the_slot_holds(checkpoint):
    params = _rank_params(_tensors(), 1, 2, list(range(E)))
    w13 = params[f"{FUSED}.w13_weight"]
    params[f"{FUSED}.w13_weight"] = torch.cat([w13[:, 32:], w13[:, :32]], dim=1)
    found, _ = _compare(checkpoint, params, 1, 2)
    assert len(found) == 2 * E and {f.kind for f in found} == {"wrong"}
    assert found[0].describe() == (
        f"rank 1 {FUSED}.w13_weight (expert 0) [0:32, 0:16] must hold {PREFIX}.0.gate_proj.weight[32:64, 0:16]: "
        f"wrong (holds {PREFIX}.0.up_proj.weight[32:64, 0:16] (rank 1's part) instead)")


def test_a_shard_at_the_wrong_offset_and_an_unsharded_scale(checkpoint):
    t = _tensors()
    params = _rank_params(t, 1, 2, list(range(E)))
    params[f"{FUSED}.w2_weight"] = _rank_params(t, 0, 2, list(range(E)))[f"{FUSED}.w2_weight"]  # rank 0's columns
    params[f"{FUSED}.w2_weight_scale"] = torch.stack([t[f"{PREFIX}.{e}.down_proj.weight_scale"] for e in range(E)])
    found, _ = _compare(checkpoint, params, 1, 2)
    assert [f.describe() for f in found if f.expert == 2] == [
        f"rank 1 {FUSED}.w2_weight (expert 2) [0:32, 0:16] must hold {PREFIX}.2.down_proj.weight[0:32, 16:32]: wrong "
        f"(holds {PREFIX}.2.down_proj.weight[0:32, 0:16] (rank 0's part) instead)",
        f"rank 1 {FUSED}.w2_weight_scale (expert 2) [0:32, 0:2] must hold {PREFIX}.2.down_proj.weight_scale"
        f"[0:32, 2:4]: wrong (holds {PREFIX}.2.down_proj.weight_scale[0:32, 0:2] (rank 0's part) instead)"]


def test_one_value_per_projection_in_the_wrong_expert_row(checkpoint):
    params = _rank_params(_tensors(), 0, 2, list(range(E)))
    params[f"{FUSED}.w13_weight_scale_2"][1] = params[f"{FUSED}.w13_weight_scale_2"][3]
    found, _ = _compare(checkpoint, params, 0, 2)
    assert [f.describe() for f in found] == [
        f"rank 0 {FUSED}.w13_weight_scale_2 (expert 1) [0:1] must hold {PREFIX}.1.gate_proj.weight_scale_2[0:1]: "
        f"wrong (holds {PREFIX}.3.gate_proj.weight_scale_2[0:1] instead)",
        f"rank 0 {FUSED}.w13_weight_scale_2 (expert 1) [1:2] must hold {PREFIX}.1.up_proj.weight_scale_2[0:1]: "
        f"wrong (holds {PREFIX}.3.up_proj.weight_scale_2[0:1] instead)"]


def test_the_router_is_whole_on_every_rank_and_a_wrong_parallel_config_is_named(checkpoint):
    params = _rank_params(_tensors(), 0, 2, list(range(E)))
    params[f"{PREFIX[:-8]}.gate.weight"] = params[f"{PREFIX[:-8]}.gate.weight"] * 2
    facts = RankFacts(0, 1, 0, 1, tuple(range(E)), E)  # vLLM thinks it is alone
    found, _ = shards.compare_rank(params, facts, 0, 2, False, split.Checkpoint(checkpoint))
    kinds = {(f.param, f.kind) for f in found}
    assert (f"{PREFIX[:-8]}.gate.weight", "wrong") in kinds
    assert found[0].describe() == ("rank 0 (MoE parallel config): owner (vLLM's MoE layer has tp_rank 0, tp_size 1, "
                                   "ep_size 1; the layout means 0, 2, 1)")


def test_experts_on_no_rank_on_two_and_written_by_a_rank_that_does_not_hold_them():
    facts = {0: RankFacts(0, 1, 0, 2, (0, 1), E), 1: RankFacts(0, 1, 1, 2, (1, 2), E)}
    found = ranked.owners(facts, {0: [(f"{FUSED}.w2_input_scale", 3, (1,))], 1: []}, True, {})
    assert [f.describe() for f in found] == [
        "rank 0 (expert map) (expert 1): owner (on rank(s) 0, 1; the layout puts it on 1 rank(s))",
        "rank 0 (expert map) (expert 3): owner (on rank(s) none; the layout puts it on 1 rank(s))",
        f"rank 0 {FUSED}.w2_input_scale (expert 3) [1]: owner (its weight loader wrote expert 3, which rank 0 does "
        "not hold, into row 1 (expert 1))"]
    assert ranked.owners(facts, {0: [(f"{FUSED}.w2_input_scale", 3, (3,))]}, True,
                         {0: {f"{FUSED}.w2_input_scale"}})[2:] == []  # indexed by global expert: every rank's


def test_impossible_names_the_first_tensor_that_cannot_split_and_ignores_a_malformed_one(tmp_path):
    t = _tensors()
    short = f"{PREFIX}.1.down_proj.weight_scale"
    t[short] = t[short][:, :3].contiguous()  # one column short
    save_file(t, str(tmp_path / "model.safetensors"))
    ck = split.Checkpoint(tmp_path)
    assert ck.malformed(f"{PREFIX}.1.down_proj.weight_scale") and not ck.malformed(f"{PREFIX}.0.down_proj.weight")
    assert ck.unit(PREFIX, "down_proj", "weight", "w2") == 8 and ck.unit(PREFIX, "down_proj", "weight_scale", "w2") == 1
    assert split.impossible(ck, 1) is None and split.impossible(ck, 4) is None
    assert split.impossible(ck, 8) == (f"{PREFIX}.*.down_proj.weight [32, 32]: 32 along axis 1 (4 blocks of 8) cannot "
                                       "be split evenly over 8 ranks")
