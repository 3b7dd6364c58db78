"""index.html: one self-contained page (inline CSS, JS and data; no URL is fetched), usable offline.

The page carries every case as compact columns (row, column, check, outcome, flags) so the filters can
recount cells in the browser; only cases a maintainer must read (not plain passes) carry their text. The
page's template, style and script are package data (static/page.html, page.css, page.js), inlined here.
"""

from __future__ import annotations

import bisect
import functools
import html
import importlib.resources
import json
import re
from typing import Any

from quantmatrix import properties as P
from quantmatrix.report import links
from quantmatrix.report.crossarch import describe_disagreement
from quantmatrix.report.diff import history_entries
from quantmatrix.report.model import DISAGREE, DIVERGED, LOST, OUTCOMES, CaseResult, Grid, Input, NightReport

# Bits of a case's flags; the page's JS reads the same numbers. 8: coverage lost (any tag in LOST).
FLAGS = {"new_failure": 1, "still_failing": 2, "fixed": 4, "flaky": 16, DISAGREE: 32, DIVERGED: 64}
LOST_BIT = 8


def _data(report: NightReport, g: Grid) -> dict[str, Any]:
    row_of = {r: i for i, r in enumerate(g.rows)}
    col_of = {c: i for i, c in enumerate(g.cols)}
    checks = sorted({c.axes[3] for c in report.cases.values()})
    check_of = {c: i for i, c in enumerate(checks)}
    outcome_of = {o: i for i, o in enumerate(OUTCOMES)}
    cases = list(report.cases.values())
    flags = [_flags(c.tags) if c.tags else 0 for c in cases]
    # One list per field, built by comprehensions: this loop runs once per case (100k in the bench).
    cols = {"r": [row_of[c.axes[0]] for c in cases], "k": [col_of[c.axes[1:3]] for c in cases],
            "h": [check_of[c.axes[3]] for c in cases], "o": [outcome_of[c.outcome] for c in cases],
            "f": flags}
    keys = list(report.cases)  # sorted: a case's index is found by bisection, no 100k-entry dict needed

    def index(key: str) -> int:
        return bisect.bisect_left(keys, key)

    details = {i: _detail(report, c) for i, c in enumerate(cases) if flags[i] or c.outcome != "passed"}
    d = report.diff
    lost = sorted(set(d["newly_skipped"]) | set(d["newly_missing"]) | set(d["still_missing"]))
    disagreements = [{"text": describe_disagreement(x), "red": sum(y["red"] for y in x["differs"]),
                      "cases": [index(y["case"]) for y in x["differs"]]} for x in report.disagreements]
    return {
        "night": report.night, "previous": report.previous_night, "exit": report.exit_code,
        "totals": report.totals(), "archs_lost": d["archs_lost"], "outcomes": list(OUTCOMES),
        "rows": [[r, g.schemes.get(r, "")] for r in g.rows], "cols": [list(c) for c in g.cols],
        "checks": checks, "cases": cols, "details": details,
        "lists": {"New failures": [index(k) for k in d["new_failures"]],
                  "Coverage lost": [index(k) for k in lost],
                  "Still failing": [index(k) for k in d["still_failing"]],
                  "Fixed": [index(k) for k in d["fixed"]], "Flaky": [index(k) for k in d["flaky"]]},
        "disagreements": disagreements,
        "bad": report.bad_inputs, "vllm_broken": report.vllm_broken(),
        "runs": [_run(i) for i in report.inputs],
    }


def _run(inp: Input) -> dict[str, Any]:
    p = {**inp.common, **inp.properties}
    return {"path": inp.path, "cases": inp.cases, "arch": ", ".join(inp.archs),
            **{k: p.get(k, "") for k in (P.RUNNER, P.DEVICE_NAME, P.VLLM_VERSION, P.TORCH_VERSION)}}


def _flags(tags: frozenset[str]) -> int:
    return sum(FLAGS.get(t, 0) for t in tags) | (LOST_BIT if tags & LOST else 0)


def _detail(report: NightReport, c: CaseResult) -> dict[str, Any]:
    """What the page shows of a case that is not a plain pass."""
    prop = c.prop
    det: dict[str, Any] = {"id": c.key, "msg": c.message, "log": c.log_tail,
                           "vllm": report.vllm_version(c) or "", "device": prop(P.DEVICE_NAME, ""),
                           "runner": prop(P.RUNNER, ""), "attempts": c.attempts}
    if (reason := prop(P.WAIVER_REASON)) is not None:
        det["waiver"] = {"reason": reason, "link": prop(P.WAIVER_LINK, ""), "expires": prop(P.WAIVER_EXPIRES, "")}
    if c.key in report.diff["bisect"]:
        det["bisect"] = report.diff["bisect"][c.key]
    det.update({f"offer_{k}": v for k, v in links.offers(report, c).items()})
    if c.history:
        det["history"] = [[report.nights[j]["night"], o, v or ""]
                          for j, (o, v) in enumerate(history_entries(c.history))]
    return det


def render(report: NightReport, g: Grid) -> str:
    # "<" escaped so no message can close the <script> element the data lives in.
    data = json.dumps(_data(report, g), separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")
    title = html.escape(f"quantmatrix nightly {report.night}")
    parts = {"TITLE": title, "CSS": _static("page.css"), "JS": _static("page.js"), "DATA": data}
    # one pass over the template: nothing substituted is searched again
    return re.sub(r"@(TITLE|CSS|JS|DATA)@", lambda m: parts[m.group(1)], _static("page.html"))


@functools.cache
def _static(name: str) -> str:
    """A file of static/, read once per process: the same for every report."""
    return (importlib.resources.files("quantmatrix.report") / "static" / name).read_text(encoding="utf-8")

