"""One rank's loaded MoE tensors against the reference split (measure.split): which slots hold something other
than their part of the checkpoint, and what they hold instead. Measurements, never verdicts (checks.ranks judges
them; measure.ranked puts the ranks together)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch

from quantmatrix.adapter.parallel import RankFacts
from quantmatrix.adapter.roles import FUSED_SHARDS, SHARDS, fused_checkpoint_name, fused_parts
from quantmatrix.checkpoints.producers import role_of
from quantmatrix.measure import fused as fused_split
from quantmatrix.measure.ranked import ShardFinding
from quantmatrix.measure.split import (
    Checkpoint,
    Place,
    diagnose,
    place,
    same,
    slices,
    source_part,
    split_axis,
)


def moe_ranks(tp: int, ep: bool) -> int:
    """Ranks each expert is sliced over: the layout's tensor-parallel size, 1 under expert parallelism."""
    return 1 if ep else tp


def compare_rank(params: Mapping[str, torch.Tensor], facts: RankFacts, rank: int, tp: int, ep: bool,
                 ck: Checkpoint) -> tuple[list[ShardFinding], int]:
    """Every slot of the rank's MoE parameters that has a part in the checkpoint, against that part; returns the
    findings and how many slots were compared."""
    ranks = moe_ranks(tp, ep)
    findings = _rank_facts(rank, facts, tp, ep)
    compared = 0
    for name, p in params.items():
        if p.shape == (0,):
            continue  # a placeholder no expert row (GPTQ's symmetric qzeros under MoeWNA16Method: nothing to load)
        parts = fused_parts(name)
        if parts is None:
            found, n = _whole(rank, name, p, ck)
        else:
            found, n = _fused(rank, name, p, parts, facts, rank % ranks, ranks, ck)
        findings += found
        compared += n
    return findings, compared


def _rank_facts(rank: int, facts: RankFacts, tp: int, ep: bool) -> list[ShardFinding]:
    want = (rank % moe_ranks(tp, ep), moe_ranks(tp, ep), tp if ep else 1)
    got = (facts.tp_rank, facts.tp_size, facts.ep_size)
    if got == want:
        return []
    return [ShardFinding(rank, "(MoE parallel config)", "owner", detail=f"vLLM's MoE layer has tp_rank {got[0]}, "
                         f"tp_size {got[1]}, ep_size {got[2]}; the layout means {want[0]}, {want[1]}, {want[2]}")]


def _whole(rank: int, name: str, p: torch.Tensor, ck: Checkpoint) -> tuple[list[ShardFinding], int]:
    """A parameter outside the fused experts (the router): whole on every rank when it has the checkpoint's shape."""
    if name not in ck.headers:
        return [], 0
    source = ck.tensor(name)
    if tuple(source.shape) != tuple(p.shape):
        return [ShardFinding(rank, name, "unplaced", detail=f"{list(p.shape)} from {list(source.shape)}: no rule "
                                                            "for a split linear outside the experts")], 0
    if same(p.data, source):
        return [], 1
    return [ShardFinding(rank, name, "wrong", source=name, detail="differs from the checkpoint")], 1


def _rows(p: torch.Tensor, facts: RankFacts) -> Iterator[tuple[int, int]]:
    """(row, global expert) of a fused parameter: the rank's own experts, or every expert for a parameter vLLM
    indexes by global expert on every rank (dim 0 the global count)."""
    if p.dim() and p.shape[0] == len(facts.experts):
        yield from ((row, e) for row, e in enumerate(facts.experts) if e >= 0)
    elif p.dim() and p.shape[0] == facts.global_experts:
        yield from ((e, e) for e in range(facts.global_experts))


def source_name(ck: Checkpoint, module: str, expert: int, shard: str, leaf: str) -> str | None:
    """The checkpoint tensor a shard of an expert is loaded from (either naming), None when the file has none."""
    return next((n for proj in SHARDS[shard] if (n := f"{module}.{expert}.{proj}.{leaf}") in ck.headers), None)


def _fused(rank: int, name: str, p: torch.Tensor, parts: tuple[str, str, str], facts: RankFacts, tp_rank: int,
           ranks: int, ck: Checkpoint) -> tuple[list[ShardFinding], int]:
    module, fused, leaf = parts
    findings: list[ShardFinding] = []
    compared = 0
    if p.dim() == 0 or not any(True for _ in _rows(p, facts)):
        return [ShardFinding(rank, name, "unplaced", detail=f"{list(p.shape)}: no expert rows this rank knows")], 0
    whole = fused_checkpoint_name(module, fused, leaf)
    if whole is not None and whole in ck.headers:  # one tensor for every expert (gpt-oss): measure.fused
        return fused_split.compare(rank, name, p, _rows(p, facts), fused, leaf, whole, tp_rank, ranks, ck)
    for row, expert in _rows(p, facts):
        slots: dict[tuple[object, ...], list[tuple[str, Place]]] = {}
        for shard in FUSED_SHARDS[fused]:
            src = source_name(ck, module, expert, shard, leaf)
            if src is None or ck.malformed(src):
                continue  # nothing to load there: the audit (unloaded) and the lint (malformed) name it
            projection = src.split(".")[-2]
            where = place(shard, ck.shape(src), tuple(p.shape[1:]), tp_rank, ranks, role_of(leaf),
                          ck.unit(module, projection, leaf, shard))
            if isinstance(where, tuple):
                findings.append(ShardFinding(rank, name, where[0], expert, source=src, detail=where[1]))
                continue
            slots.setdefault((where.flat, where.transposed, *((s.start, s.stop) for s in where.dest)), []).append(
                (src, where))
        for candidates in slots.values():
            compared += 1
            bad = _check_slot(p.data[row], candidates, ck)
            if bad is not None:
                held, src, where = bad
                findings.append(ShardFinding(
                    rank, name, "wrong", expert, slices(where.dest) + (" (of the row transposed)" if where.transposed
                                                                       else ""), f"{src}{slices(where.source)}",
                    diagnose(held, _alternatives(ck, module, expert, fused, leaf, (src, tp_rank), ranks, where.flat,
                                                 facts.global_experts))))
    return findings, compared


def _check_slot(row: torch.Tensor, candidates: list[tuple[str, Place]], ck: Checkpoint
                ) -> tuple[torch.Tensor, str, Place] | None:
    """None when the slot holds the part of one of its candidates (two for a slot gate and up share), else what
    it holds and the first candidate."""
    held = candidates[0][1].held(row)
    for src, where in candidates:
        if same(held, where.part(ck.tensor(src))):
            return None
    return held, *candidates[0]


def _alternatives(ck: Checkpoint, module: str, expert: int, fused: str, leaf: str, own: tuple[str, int],
                  ranks: int, flat: bool, total: int) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """The parts a misplaced slot most likely holds: another rank's part or the other shard's (gate for up), then
    another expert's."""
    for e in (expert, *(x for x in range(total) if x != expert)):
        for shard in FUSED_SHARDS[fused]:
            src = source_name(ck, module, e, shard, leaf)
            if src is None or ck.malformed(src):
                continue
            shape = ck.shape(src)
            split_ranks = range(ranks) if not flat and split_axis(shard, shape, role_of(leaf)) is not None else (0,)
            unit = ck.unit(module, src.split(".")[-2], leaf, shard)
            for r in split_ranks:
                if src == own[0] and (r == own[1] or len(split_ranks) == 1):
                    continue
                alt = Place((slice(0, 1),) if flat else source_part(shard, shape, r, ranks, role_of(leaf), unit), (),
                            flat)
                label = f"{src}{slices(alt.source)}" + (f" (rank {r}'s part)" if len(split_ranks) > 1 else "")
                yield label, (lambda s=src, p=alt: p.part(ck.tensor(s)))
