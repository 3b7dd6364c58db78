"""Tonight against last night: last night's summary.json, the history it carries, and the diff tags.

summary.json is the only memory between nights: each case's history travels in it, so tomorrow's diff
needs tonight's summary and nothing else.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantmatrix import bounded
from quantmatrix import properties as P
from quantmatrix.errors import ReportError
from quantmatrix.report.model import OUTCOMES, PASS, RAN, RED, SCHEMA, CaseResult, Input, natural, summary_entry
from quantmatrix.report.read import axes_of


@dataclasses.dataclass
class Previous:
    """Last night's summary.json; full properties are rebuilt only for the cases carried over as missing."""

    night: str
    date: str
    nights: list[dict[str, str]]
    inputs: list[dict[str, Any]]
    cases: dict[str, dict[str, Any]]

    def props(self, case: Mapping[str, Any]) -> dict[str, str]:
        f = case.get("file")
        own = case["properties"]
        return {**self.inputs[f]["common"], **own} if f is not None else dict(own)


def load_previous(path: str | Path) -> Previous:
    """Read last night's summary.json; anything unreadable is a ReportError naming the file."""
    path = Path(path)
    try:
        data = json.loads(bounded.read_bytes(path, "summary").decode("utf-8"))
    except bounded.InputError as e:
        raise ReportError(f"{path}: cannot read previous summary: {e.why}") from None
    except (ValueError, RecursionError) as e:  # RecursionError: JSON nested 100k deep
        raise ReportError(f"{path}: previous summary is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ReportError(f"{path}: not a quantmatrix summary of schema {SCHEMA} (schema: {got!r})")
    try:
        prev = Previous(str(data["night"]), str(data["date"]), list(data["nights"]), list(data["inputs"]),
                        dict(data["cases"]))
        for i, night in enumerate(prev.nights):
            if type(night) is not dict or type(night.get("night")) is not str or type(night.get("date")) is not str:
                raise ValueError(f"nights[{i}] is not {{night: str, date: str}}: {str(night)[:100]}")
        for inp in prev.inputs:
            if not (_strings(inp["common"]) and _strings(inp["properties"])):
                raise ValueError(f"input {str(inp.get('path'))[:100]!r} has malformed common or properties")
        outcomes, files, kept = frozenset(OUTCOMES), range(len(prev.inputs)), len(prev.nights)
        for key, c in prev.cases.items():  # one pass, cheap checks: it runs for 100k cases a night
            f = c.get("file")
            history = c.get("history", "")
            if type(c) is not dict or c["outcome"] not in outcomes or not _strings(c["properties"]) or \
                    type(history) is not str or not (f is None or (type(f) is int and f in files)):
                raise ValueError(f"case {key!r} has outcome {str(c['outcome'])[:100]!r} or malformed properties, "
                                 "history or file")
            # the cheap test first; a tab or newline (history.split() splits on any) never skips the count
            if (history.count(" ") >= kept or not history.isprintable()) and len(history.split()) > kept:
                raise ValueError(f"case {key!r} has {len(history.split())} nights of history, the summary "
                                 f"names {kept}")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise ReportError(f"{path}: previous summary is malformed ({type(e).__name__}: {e})") from None
    return prev


def _strings(d: Any) -> bool:
    """A JSON object of strings (properties, as JUnit carries them): a number where a version string belongs would
    fail deep inside the diff."""
    return type(d) is dict and all(type(v) is str for v in d.values())


def history_entries(history: str) -> list[tuple[str, str | None]]:
    """(outcome, vLLM version) per night, newest first, aligned with the summary's `nights`.

    summary.json stores a case's history as one string, "passed@0.11.1 missing failed@0.11.0": a list of
    pairs per case would be ~15 JSON values, and 100k cases x 7 nights of them dominate loading it.
    """
    out: list[tuple[str, str | None]] = []
    for entry in history.split():
        outcome, _, vllm = entry.partition("@")
        out.append((outcome, vllm or None))
    return out


def _alternates(now: str, history: str) -> bool:
    """Flaky over nights: the pass/fail sequence (skips ignored) changes direction at least twice."""
    red = now in RED or "failed" in history or "error" in history
    if not (red and (now in PASS or "passed" in history)):
        return False  # never both red and green in the window: the common case, decided without parsing
    seq = [o in PASS for o in [now] + [o for o, _ in history_entries(history)] if o in PASS or o in RED]
    return sum(a != b for a, b in zip(seq, seq[1:], strict=False)) >= 2


def _no_space(v: str | None) -> str | None:
    return "".join(v.split()) if v else None


class Differ:
    """Tags cases against last night one at a time (as they are merged), then carries what vanished as
    `missing` (a coverage loss) and lists every tag."""

    def __init__(self, prev: Previous | None, history: int, provisioned: frozenset[str] | None = None) -> None:
        self.prev, self.keep = prev, history
        # the archs that have a runner (None: every arch counts); a missing case of any other arch is no lost
        # coverage, only a cell nobody is set up to run
        self.provisioned = provisioned
        self.pcases = prev.cases if prev else {}
        self.nights = ([{"night": prev.night, "date": prev.date}] + prev.nights)[:history] if prev else []
        self.bisect: dict[str, dict[str, Any]] = {}
        # the vLLM version of each of last night's files, as history writes it (entries are space-separated)
        self.file_vllm = [_no_space(i["common"].get(P.VLLM_VERSION, i["properties"].get(P.VLLM_VERSION)))
                          for i in prev.inputs] if prev else []

    def _vllm(self, pc: Mapping[str, Any]) -> str | None:
        v = pc["properties"].get(P.VLLM_VERSION)
        if v is not None:
            return _no_space(v)
        f = pc.get("file")
        return self.file_vllm[f] if f is not None else None

    def case(self, c: CaseResult) -> None:
        """Give `c` its history and tags, then seal its summary entry; called again for a folded rerun."""
        key = c.key
        pc = self.pcases.get(key)
        before = None
        if pc is not None:
            before = pc["outcome"]
            vllm = self._vllm(pc) if before != "missing" else None
            older = pc.get("history", "")
            h = f"{before}@{vllm} {older}" if vllm else f"{before} {older}"
            if h.count(" ") >= self.keep:  # keep `history` nights
                h = h.rsplit(" ", h.count(" ") - self.keep + 1)[0]
            c.history = h.rstrip()
        now = c.outcome
        self.bisect.pop(key, None)  # a rerun folded into this case may have been a new failure
        if now in RED:
            if before in RED:
                c.tag("still_failing")
            else:
                c.tag("new_failure")
                if self.prev is not None:  # the first night has nothing to bisect against
                    entries = history_entries(c.history)
                    last = next((i for i, (o, _) in enumerate(entries) if o in PASS), None)
                    self.bisect[key] = {
                        "last_passed_night": self.nights[last]["night"] if last is not None else None,
                        "last_passed_vllm": entries[last][1] if last is not None else None}
        elif now in PASS and before in RED:
            c.tag("fixed")
        elif now == "skipped" and before in RAN:
            c.tag("newly_skipped")
        elif now == "missing":
            if self.provisioned is not None and c.arch not in self.provisioned:
                c.tag("unprovisioned")
            else:
                c.tag("still_missing" if before == "missing" else "newly_missing")
        if c.history and _alternates(now, c.history):
            c.tag("flaky")
        c.seal()

    def finish(self, cases: dict[str, CaseResult], inputs: list[Input]) -> dict[str, Any]:
        """Add last night's cases that have no result tonight to `cases` (as missing); return the diff."""
        for key, pc in self.pcases.items():
            if key in cases:
                continue
            hist = [pc["outcome"]] + [o for o, _ in history_entries(pc.get("history", ""))][: self.keep - 1]
            seen = next((i for i, o in enumerate(hist) if o != "missing"), None)
            if seen is not None:  # a case without a result in any night kept is dropped
                props = self.prev.props(pc)  # type: ignore[union-attr]
                message = f"no result tonight (last result: {self.nights[seen]['night']})"
                cases[key] = c = CaseResult(key, "missing", props, {}, axes_of(key, props),
                                            summary_entry(key, "missing", props, 0.0, message, ""), message)
                self.case(c)
        d: dict[str, Any] = {k: [] for k in ("new_failures", "still_failing", "fixed", "newly_skipped",
                                             "newly_missing", "still_missing", "unprovisioned", "flaky")}
        for key, c in cases.items():
            for tag in c.tags:
                d["new_failures" if tag == "new_failure" else tag].append(key)
        for v in d.values():
            v.sort()
        d["bisect"] = dict(sorted(self.bisect.items()))
        have = {arch for i in inputs for arch in i.archs}
        lost = {c.arch for k in d["newly_missing"] + d["still_missing"] if (c := cases[k]).arch not in have}
        # a provisioned arch with no result at all is lost even on a first night (nothing carried to miss)
        lost |= (self.provisioned or set()) - have
        d["archs_lost"] = sorted(lost, key=natural)
        d["nights"] = self.nights
        return d
