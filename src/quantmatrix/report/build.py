"""One night's report from its JUnit files: read them, fold reruns, diff each case as it arrives, compare
archs; and summary.json, the report as tomorrow's --previous reads it."""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Iterable
from pathlib import Path

from quantmatrix import properties as P
from quantmatrix.report.coverage import Defined
from quantmatrix.report.crossarch import agreement
from quantmatrix.report.diff import Differ, load_previous
from quantmatrix.report.model import PASS, RED, SCHEMA, CaseResult, Input, NightReport, natural, summary_entry
from quantmatrix.report.read import FileRead, Row, reading, tail

# Which of one attempt's entries decides its outcome (a call failure beats a teardown pass, and so on).
_RANK = {"error": 6, "failed": 5, "waived": 4, "xpassed": 3, "skipped": 2, "passed": 1}


def _timestamp(stamp: str) -> float:
    try:
        return datetime.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0


@dataclasses.dataclass
class _Merged:
    inputs: list[Input]
    bad: list[dict[str, str]]
    cases: dict[str, CaseResult]
    with_tokens: list[str]  # keys of the cases that stored greedy token ids, for the cross-arch comparison
    defined: Defined  # what tonight's matrices define (each file's MATRIX_CASES record, kept out of summary.json)


def _fold(reads: Iterable[FileRead], diff: Differ) -> _Merged:
    """Merge the files; a case seen more than once is folded, its latest attempt deciding the outcome.

    Two entries for one case in one file are one attempt (pytest writes a call failure and a teardown
    error as two <testcase>s), so they combine; entries in different files are reruns, ordered by time.
    Each case is diffed as it arrives, while the workers still parse the files after it.
    """
    m = _Merged([], [], {}, [], Defined())
    inputs, cases, with_tokens = m.inputs, m.cases, m.with_tokens
    first: dict[str, tuple[int, Row]] = {}  # a case's first entry, and the input it came from
    dups: dict[str, list[tuple[int, Row]]] = {}
    for read in reads:
        if read.problem:
            m.bad.append({"path": read.path, "problem": read.problem})
            continue
        idx = len(inputs)
        archs = sorted({row.axes[1] for row in read.rows}, key=natural)
        m.defined.add(P.decode_matrix_cases(read.properties.pop(P.MATRIX_CASES, None)))
        stamp = read.rows[0].stamp if read.rows else ""
        inputs.append(Input(read.path, len(read.rows), archs, read.properties, read.common, stamp))
        common = read.common
        tokens_common = P.GREEDY_TOKEN_IDS in common
        for row in read.rows:
            key = row.key
            if key in first:
                dups.setdefault(key, [first[key]]).append((idx, row))
                continue
            first[key] = (idx, row)
            cases[key] = case = CaseResult(key, row.outcome, row.props, common, row.axes, row.entry,
                                           row.message, row.log_tail, row.time, idx)
            diff.case(case)
            if tokens_common or P.GREEDY_TOKEN_IDS in row.props:
                with_tokens.append(key)
    for key, entries in dups.items():
        case = _rerun(key, entries, inputs)
        cases[key] = case
        diff.case(case)  # the folded case replaces the first attempt, and its tags
        if case.prop(P.GREEDY_TOKEN_IDS) is not None:
            with_tokens.append(key)
    return m


def _rerun(key: str, entries: list[tuple[int, Row]], inputs: list[Input]) -> CaseResult:
    """One case from its entries in several files (reruns, the last one deciding) or twice in one file."""
    attempts: dict[int, list[Row]] = {}
    for idx, row in entries:
        attempts.setdefault(idx, []).append(row)
    ordered = sorted(attempts.items(), key=lambda a: (_timestamp(a[1][0].stamp), a[0]))
    outcomes = [max(rows, key=lambda r: _RANK[r.outcome]).outcome for _, rows in ordered]
    idx, rows = ordered[-1]
    worst = max(rows, key=lambda r: _RANK[r.outcome])
    message = "\n".join(r.message for r in rows if r.message)
    log, seconds = tail(*(r.log_tail for r in rows)), sum(r.time for r in rows)
    case = CaseResult(key, worst.outcome, worst.props, inputs[idx].common, worst.axes,
                      summary_entry(key, worst.outcome, worst.props, seconds, message, log), message, log,
                      seconds, idx, tuple(outcomes) if len(outcomes) > 1 else ())
    if any(o in RED for o in outcomes) and any(o in PASS for o in outcomes):
        case.tag("flaky")
    return case


def build(paths: list[str], previous: str | Path | None, *, night: str, date: datetime.date, history: int = 7,
          jobs: int = 1, bad: list[dict[str, str]] | None = None,
          provisioned: frozenset[str] | None = None, conclusion: str = "") -> NightReport:
    """Merge `paths`, diff against the `previous` summary.json and compare archs; nothing written yet. A previous
    summary of this same night (written before a late runner arrived) is replaced: the diff is against the night
    before it, and the report counts one more update of this night."""
    with reading(paths, date, jobs) as reads:
        prev = load_previous(previous) if previous is not None else None  # while the workers parse
        updates = 1
        if prev is not None and prev.night == night:
            updates, prev = prev.updates + 1, prev.rewound()
        differ = Differ(prev, history, provisioned, night=night, today=date)
        merged = _fold(reads, differ)
    diff = differ.finish(merged.cases, merged.inputs, merged.defined)
    cases = {k: merged.cases[k] for k in sorted(merged.cases)}  # every output lists cases in this order
    disagreements = agreement(cases[k] for k in sorted(set(merged.with_tokens)))
    return NightReport(night, date.isoformat(), prev.night if prev else None, history, diff.pop("nights"),
                       merged.inputs, (bad or []) + merged.bad, cases, diff, disagreements, updates, conclusion)


def summary_json(report: NightReport) -> str:
    """summary.json: versioned, with enough history that tomorrow's diff needs nothing else."""
    head = json.dumps({
        "schema": SCHEMA, "generated_by": "quantmatrix report", "night": report.night, "date": report.date,
        "previous_night": report.previous_night, "history_nights": report.history_nights,
        "nights": report.nights, "updates": report.updates, "conclusion": report.conclusion,
        "exit_code": report.exit_code, "headline": report.headline(), "totals": report.totals(),
        "inputs": [{"path": i.path, "cases": i.cases, "archs": i.archs, "stamp": i.stamp, "properties": i.properties,
                    "common": i.common} for i in report.inputs],
        "bad_inputs": report.bad_inputs, "diff": report.diff, "disagreements": report.disagreements,
    }, separators=(",", ":"), allow_nan=False)
    body = ",".join(c.entry for c in report.cases.values())
    return head[:-1] + ',"cases":{' + body + "}}"
