"""The layer-level checks under a parallel layout. One rank's build (a LayerBuild) is judged by the one-rank checks
as it always was; every rank's (measure.ranked.Ranked) is judged rank by rank by the same checks (checks.dispatch,
checks.kernel) or, for the audit, as one report whose findings name their rank (an expert's hole shows on the
rank that holds it). `shards_verdict` holds each rank to the checkpoint's reference split (measure.split). A layout
that cannot split the checkpoint exactly must be refused by vLLM (or padded as its oracle documents): a refusal
then skips the other checks, and anything loaded silently wrong fails."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from quantmatrix import properties as P
from quantmatrix.adapter.kernel import KernelFormat
from quantmatrix.adapter.layers import LayerBuild
from quantmatrix.checks import audit, dispatch, kernel
from quantmatrix.checks.verdict import FAIL, OK, Verdict
from quantmatrix.measure.loaded import AuditReport
from quantmatrix.measure.ranked import FAILING, Ranked
from quantmatrix.schema.model import Case, MoeBackend

SHOWN = 8  # slots named in a failure; the rest are counted


def layer_verdict(case: Case, build: LayerBuild | Ranked, backends: Mapping[str, MoeBackend]) -> Verdict:
    if isinstance(build, LayerBuild):
        return dispatch.layer_verdict(case, build, backends)
    return _each(case, build, lambda one, _: dispatch.layer_verdict(case, one, backends))


def audit_verdict(case: Case, build: LayerBuild | Ranked, backends: Mapping[str, MoeBackend],
                  report: AuditReport | None) -> Verdict:
    if isinstance(build, LayerBuild):
        return audit.audit_verdict(case, build, backends, report)
    refused = _refused(case, build)
    if refused is not None:
        return refused
    first = next((b for b in build.builds.values() if b.layer is not None), next(iter(build.builds.values())))
    return audit.audit_verdict(case, first, backends, build.audit)


def kernel_verdict(case: Case, build: LayerBuild | Ranked, backends: Mapping[str, MoeBackend],
                   kf: KernelFormat | Mapping[int, KernelFormat | None] | None) -> Verdict:
    if isinstance(build, LayerBuild):
        assert not isinstance(kf, Mapping)
        return kernel.kernel_verdict(case, build, backends, kf)
    return _each(case, build, lambda one, rank: kernel.kernel_verdict(case, one, backends, build.kernels[rank]))


def _refused(case: Case, ranked: Ranked) -> Verdict | None:
    """A skip where vLLM refused a layout that cannot split the checkpoint exactly (the refusal it owes)."""
    errors = {r: b.error for r, b in ranked.builds.items() if b.error}
    if not errors or not ranked.impossible or case.cell.checkpoint.expectation("resolves_to") == "rejected":
        return None
    refusal = _by_rank(errors, ranked.builds)
    return Verdict.skip(f"vLLM refuses layout {ranked.name}, as it must ({ranked.impossible}): {refusal}",
                        [(P.LAYOUT_REFUSED, refusal)])


def _each(case: Case, ranked: Ranked, one: Callable[[LayerBuild, int], Verdict]) -> Verdict:
    """The one-rank check on every rank: failures named by their ranks, properties equal on every rank kept as
    one value, else per rank."""
    refused = _refused(case, ranked)
    if refused is not None:
        return refused
    verdicts = {rank: one(build, rank) for rank, build in ranked.builds.items()}
    props = _merged_properties(verdicts) + [(P.LAYOUT_NOTE, ranked.note)]
    failed = {r: v.problem for r, v in verdicts.items() if v.outcome == FAIL}
    if failed:
        return Verdict.fail(case, _by_rank(failed, verdicts), props)
    if all(v.outcome == OK for v in verdicts.values()):
        return Verdict.ok(props)
    return Verdict.skip(_by_rank({r: v.reason for r, v in verdicts.items() if v.reason}, verdicts), props)


def _merged_properties(verdicts: Mapping[int, Verdict]) -> list[tuple[str, object]]:
    values: dict[str, dict[int, object]] = {}
    for rank, v in verdicts.items():
        for key, value in v.properties:
            values.setdefault(key, {})[rank] = value
    return [(key, _by_rank(per, verdicts)) for key, per in values.items()]


def _by_rank(per: Mapping[int, object], every: Iterable[int]) -> str:
    """One value when every rank of the layout has it, else `ranks 0,2: a; rank 1: b` (in rank order)."""
    groups: dict[str, list[int]] = {}
    for rank, value in sorted(per.items()):
        groups.setdefault(str(value), []).append(rank)
    if len(groups) == 1 and set(next(iter(groups.values()))) == set(every):
        return next(iter(groups))
    return "; ".join(f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))}: {value}"
                     for value, rs in groups.items())


def shards_verdict(case: Case, ranked: Ranked) -> Verdict:
    """Every rank holds exactly its part of every checkpoint tensor (the reference split from the files), every
    expert sits on the ranks the layout puts it on, and an impossible layout is refused, not loaded wrong."""
    ck = case.cell.checkpoint
    errors = {r: b.error for r, b in ranked.builds.items() if b.error}
    props: list[tuple[str, object]] = [(P.LAYOUT_NOTE, ranked.note)]
    if errors:
        if ck.expectation("resolves_to") == "rejected":
            return Verdict.skip("vLLM refuses this config, as the matrix expects: there are no shards to compare")
        if ranked.impossible:
            return Verdict.ok(props + [(P.LAYOUT_REFUSED, _by_rank(errors, ranked.builds))])
        return Verdict.fail(case, f"vLLM refused layout {ranked.name}, which splits {ck.id} exactly: "
                                  f"{_by_rank(errors, ranked.builds)}", props)
    bad = [f for f in ranked.shards if f.kind in FAILING]
    notes = [f.describe() for f in ranked.shards if f.kind not in FAILING]
    props += [(P.EXPERT_PLACEMENT, ranked.placement()), (P.SHARDS_COMPARED, ranked.compared),
              (P.SHARD_NOTES, "; ".join(notes))]
    if bad:
        more = f"; and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        why = f" (a layout that cannot split exactly: {ranked.impossible})" if ranked.impossible else ""
        return Verdict.fail(case, f"{len(bad)} slot(s) under layout {ranked.name} differ from the reference split "
                                  f"of the checkpoint's files{why}: "
                                  + "; ".join(f.describe() for f in bad[:SHOWN]) + more, props)
    if ranked.compared == 0:
        return Verdict.fail(case, f"no slot of any rank under layout {ranked.name} could be compared with the "
                                  "checkpoint: vLLM's MoE parameters no longer match its tensors' names")
    return Verdict.ok(props)
