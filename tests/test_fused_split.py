"""The reference split of gpt-oss's fused checkpoint tensors (measure.fused: one tensor per projection for every
expert, gate and up rows interleaved) against a rank's tensors, on hand-made tensors: a correct rank, padded as
vLLM's MXFP4 MARLIN pads it, matches; a rank holding another rank's rows, or a down bias added on a second rank,
is named by rank, tensor, expert and slice. Fast: no vLLM (the real ranks run in the default matrix's
gptoss-tiny-mxfp4 rank_shards cases)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from quantmatrix.adapter.parallel import RankFacts
from quantmatrix.measure import shards, split

E, FFN, H, PAD = 4, 64, 64, 2  # experts, expert ffn, hidden; rows and columns padded to PAD x (MARLIN rounds up)
EXPERTS = "model.layers.0.mlp.experts"
FUSED = f"{EXPERTS}.routed_experts"


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def u8(*shape: int) -> torch.Tensor:
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)

    return {f"{EXPERTS}.gate_up_proj_blocks": u8(E, 2 * FFN, H // 32, 16),
            f"{EXPERTS}.gate_up_proj_scales": u8(E, 2 * FFN, H // 32),
            f"{EXPERTS}.gate_up_proj_bias": torch.randn(E, 2 * FFN, generator=g).to(torch.bfloat16),
            f"{EXPERTS}.down_proj_blocks": u8(E, H, FFN // 32, 16),
            f"{EXPERTS}.down_proj_scales": u8(E, H, FFN // 32),
            f"{EXPERTS}.down_proj_bias": torch.randn(E, H, generator=g).to(torch.bfloat16)}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    path = tmp_path_factory.mktemp("gptoss")
    t = _tensors()
    save_file(t, str(path / "model.safetensors"))
    return path, t


def _padded(part: torch.Tensor) -> torch.Tensor:
    """The part at the front of a row PAD x its size along every axis (zeros beyond, as vLLM creates them)."""
    out = torch.zeros([s * PAD for s in part.shape], dtype=part.dtype)
    out[tuple(slice(0, s) for s in part.shape)] = part
    return out


def _rank_params(t: dict[str, torch.Tensor], rank: int, tp: int) -> dict[str, torch.Tensor]:
    """What a correct rank holds, written out by hand: w13 rows rank x 2*ffn/tp.., w2 columns per 32 inputs, the
    down bias on rank 0 only."""
    rows, cols = 2 * FFN // tp, FFN // tp
    out: dict[str, list[torch.Tensor]] = {}
    for e in range(E):
        blocks = t[f"{EXPERTS}.gate_up_proj_blocks"][e].reshape(2 * FFN, -1)
        down = t[f"{EXPERTS}.down_proj_blocks"][e].reshape(H, -1)
        bias = t[f"{EXPERTS}.down_proj_bias"][e]
        for name, part in (("w13_weight", blocks[rank * rows:(rank + 1) * rows]),
                           ("w13_weight_scale", t[f"{EXPERTS}.gate_up_proj_scales"][e][rank * rows:(rank + 1) * rows]),
                           ("w13_bias", t[f"{EXPERTS}.gate_up_proj_bias"][e][rank * rows:(rank + 1) * rows]),
                           ("w2_weight", down[:, rank * cols // 2:(rank + 1) * cols // 2]),
                           ("w2_weight_scale", t[f"{EXPERTS}.down_proj_scales"][e][:, rank * cols // 32:
                                                                                   (rank + 1) * cols // 32]),
                           ("w2_bias", bias if rank == 0 else torch.zeros_like(bias))):
            out.setdefault(f"{FUSED}.{name}", []).append(_padded(part))
    return {n: torch.stack(rows_) for n, rows_ in out.items()}


def _compare(path: Path, params: dict[str, torch.Tensor], rank: int, tp: int):
    facts = RankFacts(rank, tp, 0, 1, tuple(range(E)), E)
    return shards.compare_rank(params, facts, rank, tp, False, split.Checkpoint(path))


@pytest.mark.parametrize("tp", [1, 2])
def test_correct_padded_ranks_match_the_reference(checkpoint, tp):
    path, t = checkpoint
    for rank in range(tp):
        found, compared = _compare(path, _rank_params(t, rank, tp), rank, tp)
        assert found == [] and compared == 6 * E


def test_another_ranks_rows_and_a_second_down_bias_are_named(checkpoint):
    path, t = checkpoint
    params = _rank_params(t, 1, 2)
    params[f"{FUSED}.w13_weight"][2] = _rank_params(t, 0, 2)[f"{FUSED}.w13_weight"][2]  # rank 0's rows
    params[f"{FUSED}.w2_bias"][3] = _padded(t[f"{EXPERTS}.down_proj_bias"][3])  # added on rank 1 too
    found, _ = _compare(path, params, 1, 2)
    assert [f.describe() for f in found] == [
        f"rank 1 {FUSED}.w13_weight (expert 2) [0:64, 0:32] must hold {EXPERTS}.gate_up_proj_blocks[2][64:128, 0:32]:"
        f" wrong (holds {EXPERTS}.gate_up_proj_blocks[2][0:64, 0:32] (rank 0's part) instead)",
        f"rank 1 {FUSED}.w2_bias (expert 3) [0:64] must hold zeros (tensor-parallel rank 0 adds "
        f"{EXPERTS}.down_proj_bias[3]): wrong (holds {EXPERTS}.down_proj_bias[3][0:64] (rank 0's part) instead)"]
