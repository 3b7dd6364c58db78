"""The reference split of a fused checkpoint tensor: one tensor per projection holding every expert (gpt-oss's
`gate_up_proj_blocks` [experts, 2 x ffn, hidden/32, 16], `down_proj_scales`, `gate_up_proj_bias`, ...), where
measure.split's rule reads one tensor per expert and projection. An expert's slice, its trailing axes flattened to
the parameter row's (blocks of 16 bytes per 32 inputs make one row of packed bytes), splits as one fused row:
gate_up column parallel over its rows as they are stored (gate and up interleaved row by row, so a rank's
contiguous part holds the gate and up of the same outputs), down row parallel over its inputs, in whole blocks of
the projection's coarsest tensor. A bias added inside the experts, before the ranks' outputs are summed, is added
once: down's bias whole on tensor-parallel rank 0 and zeros on the others (gate_up's splits with its rows). The
part sits at the front of the row: what lies beyond is the method's padding (adapter.gpt_oss.corners)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from quantmatrix.checkpoints.producers import role_of
from quantmatrix.measure.ranked import ShardFinding
from quantmatrix.measure.split import Checkpoint, Place, diagnose, place, same, slices, split_axis


def compare(rank: int, name: str, p: torch.Tensor, rows: Iterator[tuple[int, int]], fused: str, leaf: str,
            src: str, tp_rank: int, ranks: int, ck: Checkpoint) -> tuple[list[ShardFinding], int]:
    """Every expert row of a fused parameter against its part of the fused checkpoint tensor `src`."""
    findings: list[ShardFinding] = []
    compared = 0
    shard = "w2" if fused == "w2" else "w13"  # w13: one column-parallel row, gate and up as stored
    role = role_of(leaf)
    for row, expert in rows:
        whole = _expert(ck.tensor(src), expert, p.dim() - 1)
        where = place(shard, tuple(whole.shape), tuple(p.shape[1:]), tp_rank, ranks, role,
                      _unit(ck, src, shard, whole.dim()))
        if isinstance(where, tuple):
            findings.append(ShardFinding(rank, name, where[0], expert, source=src, detail=where[1]))
            continue
        compared += 1
        held = where.held(p.data[row])
        once = shard == "w2" and whole.dim() == 1 and tp_rank > 0  # a row-parallel bias off rank 0: zeros
        if same(held, torch.zeros_like(where.part(whole)) if once else where.part(whole)):
            continue
        others = ((f"{src}[{expert}]{slices(alt.source)} (rank {r}'s part)", lambda a=alt, w=whole: a.part(w))
                  for r in range(ranks) if r != tp_rank
                  if isinstance(alt := place(shard, tuple(whole.shape), tuple(p.shape[1:]), r, ranks, role,
                                             _unit(ck, src, shard, whole.dim())), Place))
        must = f"zeros (tensor-parallel rank 0 adds {src}[{expert}])" if once else \
            f"{src}[{expert}]{slices(where.source)}"
        findings.append(ShardFinding(rank, name, "wrong", expert, slices(where.dest), must, diagnose(held, others)))
    return findings, compared


def _expert(tensor: torch.Tensor, expert: int, ndim: int) -> torch.Tensor:
    """One expert's slice with its trailing axes flattened to `ndim` axes (a parameter row's)."""
    one = tensor[expert]
    return one.reshape(*one.shape[:ndim - 1], -1) if one.dim() > ndim else one


def _unit(ck: Checkpoint, src: str, shard: str, ndim: int) -> int:
    """Elements of `src` per block along its split axis: its extent over the coarsest extent its projection's
    two-axis tensors (blocks, scales) split along; 1 for a bias (its rows split one by one)."""
    if ndim < 2:
        return 1
    projection = src.rsplit("_", 1)[0] + "_"
    extents = {other: shape[split_axis(shard, shape, "weight") or 0]
               for other, header in ck.headers.items()
               if other.startswith(projection) and len(header.shape) >= 3
               for shape in [(header.shape[1], int(torch.Size(header.shape[2:]).numel()))]}
    mine, coarsest = extents.get(src, 0), min(extents.values(), default=0)
    return mine // coarsest if coarsest and mine % coarsest == 0 else 1
