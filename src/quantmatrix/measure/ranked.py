"""A parallel layout's measurement as data, without torch (a verdict module and the pytest process name these
for free): what one rank measured (RankResult, as JSON between the rank processes and pytest), a slot that
differs from the reference split (ShardFinding), and every rank of one checkpoint under one layout seen on one arch
(Ranked), with the experts across the ranks: under expert parallelism each on exactly one rank, and no rank's
weight loader writing an expert it does not hold."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from quantmatrix.adapter import layers
from quantmatrix.adapter.kernel import KernelFormat
from quantmatrix.adapter.parallel import RankFacts
from quantmatrix.measure.loaded import AuditReport, Finding, ranges

FAILING = ("wrong", "shape", "owner")  # what fails rank_shards; "unplaced" (no rule for the shapes) is a note


@dataclasses.dataclass(frozen=True)
class ShardFinding:
    """One rank's parameter slot that differs from the reference split (or that no rule places)."""

    rank: int
    param: str
    kind: str  # wrong (other data) | shape (the slot cannot hold its part) | owner (expert placement) | unplaced
    expert: int | None = None  # global expert id
    slot: str = ""  # where in the rank's parameter row, e.g. [0:32, :]
    source: str = ""  # what must be there: a checkpoint tensor and its slice
    detail: str = ""

    def describe(self) -> str:
        expert = f" (expert {self.expert})" if self.expert is not None else ""
        slot = f" {self.slot}" if self.slot else ""
        must = f" must hold {self.source}" if self.source else ""
        return f"rank {self.rank} {self.param}{expert}{slot}{must}: {self.kind}" + \
            (f" ({self.detail})" if self.detail else "")


@dataclasses.dataclass(frozen=True)
class Job:
    """One checkpoint under one layout, measured for every arch the matrix has."""

    checkpoint: str
    tp: int
    ep: bool
    archs: tuple[tuple[str, tuple[int, int]], ...]  # (arch name, capability)
    backends: Mapping[str, tuple[tuple[str, ...], bool]]  # MoE backend -> (reads, single_input_scale)


@dataclasses.dataclass(frozen=True)
class ArchResult:
    """The rank's block as built on one arch, its audit against that backend's reads, its kernel format."""

    method: str = ""
    backend: str = ""
    weight_only: bool = False
    error: str | None = None
    simulated_without: tuple[str, ...] = ()
    audit: AuditReport | None = None  # None: the backend's reads are unknown
    kernel: KernelFormat | None = None
    scheme: str = ""  # what the method runs (adapter.families), in the matrix's resolves_to words


@dataclasses.dataclass(frozen=True)
class RankResult:
    rank: int
    facts: RankFacts | None  # None: vLLM built no block at this rank
    archs: Mapping[str, ArchResult]
    shards: tuple[ShardFinding, ...] = ()
    compared: int = 0  # slots compared with the reference split
    # (parameter, global expert, rows written) of every write a weight loader made for an expert this rank does not
    # hold (vLLM's loaders answer False and write nothing for those)
    strays: tuple[tuple[str, int, tuple[int, ...]], ...] = ()
    global_params: tuple[str, ...] = ()  # parameters indexed by global expert (every rank holds them whole)
    note: str = ""  # what the rank's build took a liberty with (adapter.parallel.note)
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class Ranked:
    """Every rank's measurement of one checkpoint under one layout, as built on one arch, with the experts across
    the ranks (measure.shards.owners) and whether the layout can be split exactly at all (measure.split)."""

    tp: int
    ep: bool
    arch: str
    ranks: tuple[RankResult, ...]
    shards: tuple[ShardFinding, ...]  # every rank's slots, then the experts across the ranks
    impossible: str | None  # why the layout cannot split the checkpoint exactly; None: it can

    @property
    def name(self) -> str:
        return f"tp{self.tp}{'_ep' if self.ep else ''}"

    @property
    def builds(self) -> dict[int, layers.LayerBuild]:
        out = {}
        for r in self.ranks:
            a = r.archs[self.arch]
            built = layers.Built(a.method, a.backend, a.weight_only, a.scheme) if a.error is None else None
            out[r.rank] = layers.LayerBuild(built, a.error, simulated_without=a.simulated_without)
        return out

    @property
    def audit(self) -> AuditReport | None:
        """The audits of every rank as one report (each finding names its rank); None when a rank has none."""
        reports = [r.archs[self.arch].audit for r in self.ranks]
        if not reports or any(a is None for a in reports):
            return None
        return AuditReport(reports[0].backend, reports[0].reads,  # type: ignore[union-attr]
                           tuple(f for a in reports for f in a.findings),  # type: ignore[union-attr]
                           frozenset(n for a in reports for n in a.loaded))  # type: ignore[union-attr]

    @property
    def kernels(self) -> dict[int, KernelFormat | None]:
        return {r.rank: r.archs[self.arch].kernel for r in self.ranks}

    @property
    def compared(self) -> int:
        return sum(r.compared for r in self.ranks)

    @property
    def note(self) -> str:
        return next((r.note for r in self.ranks if r.note), "")

    def placement(self) -> str:
        """Which experts each rank holds: `rank 0: 0-1; rank 1: 2-3`."""
        return "; ".join(f"rank {r.rank}: {ranges(e for e in r.facts.experts if e >= 0)}" for r in self.ranks
                         if r.facts is not None)


def combine(results: list[RankResult], tp: int, ep: bool, arch: str, impossible: str | None) -> Ranked:
    """The ranks of one job as seen on one arch."""
    facts = {r.rank: r.facts for r in results if r.facts is not None}
    found = owners(facts, {r.rank: r.strays for r in results}, ep, {r.rank: set(r.global_params) for r in results})
    return Ranked(tp, ep, arch, tuple(results), tuple(f for r in results for f in r.shards) + tuple(found),
                  impossible)


def owners(facts: Mapping[int, RankFacts], strays: Mapping[int, Sequence[tuple[str, int, tuple[int, ...]]]],
           ep: bool, global_params: Mapping[int, set[str]]) -> list[ShardFinding]:
    """Experts across the ranks: under expert parallelism each on exactly one rank, otherwise on every rank; and
    no rank's weight loader writing an expert it does not hold (`strays`: rank -> (parameter, global expert, rows
    written); `global_params`: rank -> parameters indexed by global expert, which every rank holds whole)."""
    findings = []
    total = next(iter(facts.values())).global_experts if facts else 0
    for e in range(total):
        on = sorted(r for r, f in facts.items() if e in f.experts)
        want = 1 if ep else len(facts)
        if len(on) != want:
            findings.append(ShardFinding(on[0] if on else 0, "(expert map)", "owner", e, detail=(
                f"on rank(s) {', '.join(map(str, on)) or 'none'}; the layout puts it on {want} rank(s)")))
    for rank, writes in sorted(strays.items()):
        for param, expert, rows in writes:
            if param in global_params.get(rank, set()):
                continue
            held = ", ".join(f"row {r} (expert {facts[rank].experts[r]})" for r in rows
                             if rank in facts and r < len(facts[rank].experts))
            findings.append(ShardFinding(rank, param, "owner", expert, f"[{','.join(map(str, rows))}]" if rows else "",
                                         detail=f"its weight loader wrote expert {expert}, which rank {rank} does not "
                                                f"hold, into {held or 'no row (the same bytes were there)'}"))
    return findings


def to_json(result: RankResult) -> dict[str, Any]:
    """A RankResult as JSON-able data (sets as sorted lists)."""
    return _plain(dataclasses.asdict(result))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return value


def from_json(d: Mapping[str, Any]) -> RankResult:
    facts = RankFacts(**{**d["facts"], "experts": tuple(d["facts"]["experts"])}) if d["facts"] else None
    return RankResult(d["rank"], facts, {name: _arch(a) for name, a in d["archs"].items()},
                      tuple(ShardFinding(**s) for s in d["shards"]), d["compared"],
                      tuple((p, e, tuple(rows)) for p, e, rows in d["strays"]), tuple(d["global_params"]),
                      d["note"], d["seconds"])


def _arch(a: Mapping[str, Any]) -> ArchResult:
    audit = a["audit"]
    if audit is not None:
        audit = AuditReport(audit["backend"], frozenset(audit["reads"]),
                            tuple(Finding(**{**f, "experts": tuple(f["experts"])}) for f in audit["findings"]),
                            frozenset(audit["loaded"]))
    k = a["kernel"]
    if k is not None:
        k = KernelFormat(k["needs_cuda"], k["quant_config"], dict(k["alphas"]), tuple(k["activation_scales"]),
                         tuple(k["stand_ins"]), k["refused"], tuple(k["marlin_scales"]), tuple(k["marlin_wrong"]))
    return ArchResult(a["method"], a["backend"], a["weight_only"], a["error"], tuple(a["simulated_without"]), audit,
                      k, a["scheme"])
