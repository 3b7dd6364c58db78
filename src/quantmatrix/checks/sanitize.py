"""uninit_reads (the sanitize mode): in an engine run under compute-sanitizer initcheck, no kernel reads memory of
a parameter or buffer of the model that nobody wrote. The poison modes see such a read only when the fill changes
the output; initcheck sees it at the instruction, whatever the value.

A healthy model also reads uninitialised activation and scratch memory by the thousand (padding rows of the grouped
expert GEMM and the ops around it: 10,752 reads for 2 prompts x 16 tokens of the tiny bf16 Qwen3-MoE on an H200):
those are counted per kernel, never failed. A kernel the project decides to silence is matrix data (the mode's
`sanitizer.silence`, with a reason and a link); its reads are recorded apart, never dropped. `quantmatrix initcheck`
judges a saved log by the same functions.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from quantmatrix import properties as P
from quantmatrix.checks.e2e import run_properties
from quantmatrix.checks.verdict import Verdict
from quantmatrix.engine.protocol import BUILT, PROCESSED
from quantmatrix.engine.runner import GroupRun
from quantmatrix.measure.initcheck import short_kernel
from quantmatrix.measure.sanitized import BY_PID, Sanitized
from quantmatrix.measure.uninit import PRINTED, Finding, Hit, findings, ranges
from quantmatrix.schema.model import Case
from quantmatrix.schema.sanitizer import Sanitizer, Silence

STAGES = {BUILT: "as built, before process_weights_after_loading", PROCESSED: "after process_weights_after_loading",
          PRINTED: "from the PARAMS record"}
LIST_LIMIT = 50  # findings and kernels kept in a property (the rest are counted)


@dataclasses.dataclass(frozen=True)
class Judged:
    """The hits that fail (grouped per tensor) and those a silence entry covers."""

    failing: list[Finding]
    silenced: list[tuple[Hit, Silence]]


def judge(measured: Sanitized, knob: Sanitizer | None) -> Judged:
    failing: list[Hit] = []
    silenced: list[tuple[Hit, Silence]] = []
    for hit in measured.hits:
        entry = knob.silenced(hit.kernel, hit.tensor.name) if knob is not None else None
        if entry is None:
            failing.append(hit)
        else:
            silenced.append((hit, entry))
    return Judged(findings(failing), silenced)


def _where(f: Finding) -> str:
    """Experts (dim 0 of an expert tensor), then the index along the next dim: rows (w13's gate/up half, a
    weight's output row), or elements of a plain vector."""
    parts = []
    if f.experts:
        parts.append(f"expert{'s' if len(f.experts) > 1 else ''} {ranges(f.experts)}")
    if f.rows:
        vector = not f.tensor.experts and len(f.tensor.shape) == 1
        parts.append(f"{'elements' if vector else 'rows'} {ranges(f.rows)}")
    return ", ".join(parts)


def describe(f: Finding) -> str:
    """One finding for a human: layer, tensor, what it is, how much was read, experts and rows, each kernel."""
    t = f.tensor
    what = " ".join(x for x in (t.kind, t.dtype or f"{t.element_size}-byte elements", str(list(t.shape))) if x)
    where = _where(f)
    kernels = "; ".join(f"{short_kernel(h.kernel)} x{h.reads}" + (f" launched from {h.launched_from}"
                                                                  if h.launched_from else "") for h in f.hits)
    return (f"{t.name} (layer {t.layer}, tensor {t.leaf}: {what}, {STAGES.get(t.stage, t.stage)}): {f.reads} "
            f"read{'s' if f.reads != 1 else ''} of {len(f.elements)}/{t.numel} elements"
            + (f"; {where}" if where else "") + f"; kernel{'s' if len(f.hits) > 1 else ''}: {kernels}")


def headline(failing: list[Finding]) -> str:
    """The first line of a failure, which the night's matrix.md shows per cell."""
    parts = [f"{f.tensor.name} ({_where(f) or 'whole tensor'}, {f.reads} read{'s' if f.reads != 1 else ''}, "
             f"{short_kernel(f.hits[0].kernel, 60)})" for f in failing]
    return f"{len(failing)} tensor(s) of the model read where nobody wrote: " + "; ".join(parts)


def other_line(other: dict[str, int]) -> str:
    """Scratch and activation reads: counted, per kernel, most first."""
    if not other:
        return "none"
    top = ", ".join(f"{short_kernel(k, 80)} x{n}" for k, n in list(other.items())[:5])
    more = f", and {len(other) - 5} more kernels" if len(other) > 5 else ""
    return f"{sum(other.values())} in {len(other)} kernel(s): {top}{more}"


def _finding_json(f: Finding) -> dict[str, Any]:
    return {"tensor": f.tensor.name, "stage": f.tensor.stage, "reads": f.reads, "elements": len(f.elements),
            "numel": f.tensor.numel, "experts": ranges(f.experts),
            "kernels": {short_kernel(h.kernel): h.reads for h in f.hits}}


def properties(measured: Sanitized, judged: Judged) -> list[tuple[str, str]]:
    compact = {"separators": (",", ":")}
    silenced = [{"tensor": h.tensor.name, "kernel": short_kernel(h.kernel), "reads": h.reads, "reason": s.reason,
                 "link": s.link} for h, s in judged.silenced[:LIST_LIMIT]]
    other = {short_kernel(k): n for k, n in list(measured.other.items())[:LIST_LIMIT]}
    return [(P.SANITIZER_REPORTS, str(measured.reports)),
            (P.UNINIT_PARAM_READS, json.dumps([_finding_json(f) for f in judged.failing[:LIST_LIMIT]], **compact)),
            (P.UNINIT_SILENCED, json.dumps(silenced, **compact)), (P.UNINIT_OTHER_READS, json.dumps(other, **compact)),
            (P.UNINIT_ORDER, "markers" if measured.ordered else "unknown"),
            (P.UNINIT_ATTRIBUTION, measured.attribution)]


def _record_problem(case: Case, run: GroupRun) -> str | None:
    states = [w.get("params") or {} for w in run.workers()]
    if any(s.get("requested") and s.get("records") for s in states):
        return None
    seen = "; ".join(f"pid {s.get('pid')}: registered_by={s.get('registered_by')}, requested={s.get('requested')}, "
                     f"records={len(s.get('records') or [])}" for s in states) or "no worker answered"
    return (f"mode {case.cell.mode.name} runs under compute-sanitizer, but no engine worker recorded the model's "
            f"parameters ({seen}); without the record no address can be named, so the mode proved nothing")


def uninit_reads(case: Case, run: GroupRun, measured: Sanitized | None) -> Verdict:
    """Fail for every read of the model's memory nobody wrote (not silenced); count the rest."""
    props = run_properties(run)
    knob = case.cell.mode.sanitizer
    if knob is None:
        return Verdict.fail(case, f"mode {case.cell.mode.name} has no `sanitizer:` knob, so its engine ran without "
                                  "compute-sanitizer and this check proves nothing there; select sanitized modes "
                                  "only (cells: [{mode: ...}])", props)
    if run.failure is not None:
        return Verdict.fail(case, f"the sanitized engine run failed: {run.failure.message()}", props)
    problem = _record_problem(case, run)
    if problem is not None or measured is None:
        return Verdict.fail(case, problem or "no sanitizer measurement", props)
    if measured.unreadable:
        return Verdict.fail(case, "compute-sanitizer's report cannot be read whole, so no verdict: "
                                  + "\n".join(measured.unreadable), props)
    judged = judge(measured, knob)
    props += properties(measured, judged)
    if not judged.failing and not measured.withheld:
        return Verdict.ok(props)
    lines = [headline(judged.failing) if judged.failing else withheld_line(measured),
             f"[{run.routed()}] compute-sanitizer {knob.tool}, {measured.reports} reports"
             + ("" if measured.attribution == BY_PID else f" (logs: {measured.attribution})") + ":"]
    lines += [f"- {describe(f)}" for f in judged.failing]
    if judged.failing and measured.withheld:
        lines.append(withheld_line(measured))
    lines += [f"other uninitialised reads (scratch/activation memory, not failed): {other_line(measured.other)}",
              f"reproduce by hand: quantmatrix initcheck {run.directory}"]
    return Verdict.fail(case, "\n".join(lines), props)


def withheld_line(measured: Sanitized) -> str:
    """Reports the sanitizer counted and never printed may be reads of the model's tensors: no green verdict."""
    return (f"compute-sanitizer withheld {measured.withheld} of {measured.withheld + measured.reports} reports "
            "(--print-limit), which may be reads of the model's tensors, so no verdict on them: raise --print-limit "
            "in the mode's sanitizer.flags")
