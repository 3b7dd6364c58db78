"""The night's model: one folded result per case, the files it came from, the report, and its grid.

Everything else in the package makes or reads these; this module imports nothing of the package but the
property names.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from quantmatrix import properties as P

SCHEMA = 1  # of summary.json; load_previous refuses any other
PASS = frozenset({"passed", "xpassed"})
RED = frozenset({"failed", "error"})
RAN = PASS | RED | {"waived"}
# a case that ran once and is untested tonight, with nothing to say why (report.coverage): red every night
LOST = frozenset({"newly_skipped", "still_skipped", "newly_missing", "still_missing"})
DISAGREE, DIVERGED = "disagree", "diverged"  # case tags: any cross-arch difference; one outside the top-k (red)
OUTCOMES = ("failed", "error", "missing", "skipped", "waived", "xpassed", "passed")
NOT_TESTED = "not tested (vLLM broken)"
# the nightly run's conclusions (GitHub's words) that make the night red whatever arrived, each in words
BAD_CONCLUSIONS = {"cancelled": "was cancelled or replaced by a newer run: this night is incomplete",
                   "timed_out": "timed out: this night is incomplete",
                   "failure": "failed: a job could not run its cases (see the run)",
                   "startup_failure": "did not start", "stale": "went stale: this night is incomplete",
                   "skipped": "was skipped: no runner ran", "action_required": "waits for an approval nobody gave"}
LOG_LINES, LOG_CHARS, MESSAGE_CHARS = 40, 4000, 1000
NONE = "(none)"  # the axis value of a case that names no cell; sorted last
# one encoder, not one per call; strict JSON (no NaN), which summary.json promises its readers
compact_json = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
json_string = json.encoder.encode_basestring_ascii  # a str as json.dumps writes it, without its per-call setup

Axes = tuple[str, str, str, str, str]  # checkpoint, arch, mode, check, scheme


def summary_entry(key: str, outcome: str, own: Mapping[str, str], seconds: float, message: str,
                  log: str) -> str:
    """A case's `"key":{...` member of summary.json's cases as far as its own file tells (no closing brace),
    without the properties summary.json does not carry (P.NOT_SUMMARIZED).

    Made where the file is parsed (a worker process), so that writing 100k entries is joining strings.
    """
    if not own.keys().isdisjoint(P.NOT_SUMMARIZED):
        own = {k: v for k, v in own.items() if k not in P.NOT_SUMMARIZED}
    entry: dict[str, Any] = {"outcome": outcome, "properties": own}
    if seconds:
        entry["time"] = seconds
    if message:
        entry["message"] = message
    if log:
        entry["log_tail"] = log
    return f"{json_string(key)}:{compact_json(entry)[:-1]}"


@dataclasses.dataclass(slots=True)
class CaseResult:
    """One test case after folding its attempts.

    Its JUnit properties are split in `own` and `common` (those every case of its file shares, one object
    per file) because 100k cases x 20 properties would otherwise dominate memory and summary.json.
    """

    key: str
    outcome: str
    own: dict[str, str]
    common: dict[str, str]
    axes: Axes
    entry: str  # its `"key":{...}` member of summary.json: summary_entry(), completed by seal()
    message: str = ""
    log_tail: str = ""
    time: float = 0.0
    file: int | None = None
    # Immutable defaults: most of 100k cases never get attempts, history or tags, and allocating empty
    # containers for each of them is a measurable part of the 5 s budget.
    attempts: tuple[str, ...] = ()
    history: str = ""  # see diff.history_entries()
    tested: str = ""  # the night it last ran (report.coverage): kept for as long as the case is
    tags: frozenset[str] = frozenset()

    def tag(self, name: str) -> None:
        self.tags = self.tags | {name}

    def seal(self) -> None:
        """Complete the summary.json entry once file, attempts and history are final (once per case).

        Done as each case is diffed, while the workers still parse, so writing summary.json is one join.
        """
        entry = self.entry
        if self.file is not None:
            entry += f',"file":{self.file}'
        if self.history:
            entry += f',"history":{json_string(self.history)}'
        if self.tested:
            entry += f',"tested":{json_string(self.tested)}'
        if self.attempts:
            entry += f',"attempts":{compact_json(list(self.attempts))}'
        self.entry = entry + "}"

    def prop(self, name: str, default: str | None = None) -> str | None:
        value = self.own.get(name)
        return value if value is not None else self.common.get(name, default)

    @property
    def props(self) -> dict[str, str]:
        return {**self.common, **self.own} if self.common else self.own

    checkpoint = property(lambda self: self.axes[0])
    arch = property(lambda self: self.axes[1])
    mode = property(lambda self: self.axes[2])
    check = property(lambda self: self.axes[3])


@dataclasses.dataclass
class Input:
    """One merged JUnit file: its host-level (testsuite) properties, and the case properties that all its
    cases share."""

    path: str
    cases: int
    archs: list[str]
    properties: dict[str, str]
    common: dict[str, str]
    stamp: str = ""  # when its run started (the suite's timestamp): the page says which runner reported when

    def setup_failure(self) -> str | None:
        """The line of a file the arch job wrote because it could not test (SETUP_FAILURE), else None."""
        record = self.properties.get(P.SETUP_FAILURE)
        if record is None:
            return None
        cause, _, detail = record.partition(": ")
        arch = self.properties.get(P.ARCH) or "an arch"
        runner = self.properties.get(P.RUNNER)
        return (f"{arch}{f' ({runner})' if runner else ''} not tested: {P.CAUSES.get(cause, cause)}"
                + (f": {detail}" if detail else ""))


@dataclasses.dataclass
class NightReport:
    """Everything the outputs show: the merged cases (sorted by key), their diff and the cross-arch check."""

    night: str
    date: str
    previous_night: str | None
    history_nights: int
    nights: list[dict[str, str]]  # newest first, aligned with every CaseResult.history
    inputs: list[Input]
    bad_inputs: list[dict[str, str]]
    cases: dict[str, CaseResult]
    diff: dict[str, Any]
    disagreements: list[dict[str, Any]]
    updates: int = 1  # reports of this night so far: a late runner updates the night's report in place
    conclusion: str = ""  # the nightly run's conclusion as GitHub gave it ("" when not a nightly)
    bundles: dict[str, str] = dataclasses.field(default_factory=dict)  # case key -> its repro bundle (report.links)

    def run_props(self, case: CaseResult) -> dict[str, str]:
        """The case's properties over its JUnit file's testsuite ones (the vLLM under test, the matrix, the run)."""
        suite = self.inputs[case.file].properties if case.file is not None else {}
        return {**suite, **case.props}

    def vllm_version(self, case: CaseResult) -> str | None:
        v = case.prop(P.VLLM_VERSION)
        if v is None and case.file is not None:
            v = self.inputs[case.file].properties.get(P.VLLM_VERSION)
        return v

    def totals(self) -> dict[str, int]:
        """Outcome counts; a red case that never ran because the vLLM under test was broken counts as
        `not tested (vLLM broken)`, apart from checks that ran and failed."""
        out = dict.fromkeys(OUTCOMES, 0)
        out.update(collections.Counter(
            NOT_TESTED if c.outcome in RED and c.prop(P.NOT_TESTED) == P.VLLM_BROKEN else c.outcome
            for c in self.cases.values()))
        return out

    def vllm_broken(self) -> list[str]:
        """One line per run whose health check found the vLLM under test broken (pytest_plugin.health)."""
        lines = []
        for inp in self.inputs:
            record = inp.properties.get(P.VLLM_HEALTH, "")
            if record.startswith(P.HEALTH_BROKEN):
                where = inp.properties.get(P.HOST_ARCH) or "a host without a GPU"
                runner = inp.properties.get(P.RUNNER) or inp.common.get(P.RUNNER, "")
                lines.append(f"vLLM under test broken on {where}{f' ({runner})' if runner else ''}: "
                             f"{record.removeprefix(P.HEALTH_BROKEN + ': ')}")
        return lines

    @property
    def exit_code(self) -> int:
        """1 while anything is red: a failing or erroring case (new or still; a live waiver makes it `waived`),
        a case that ran once and is untested tonight (report.coverage), a provisioned arch with no results, an
        arch job that could not test, a nightly run that did not complete. Red stays red until it is fixed,
        waived or dropped from the matrix, never just because it was already red last night."""
        return 1 if self.reasons() else 0

    def setup_failures(self) -> list[str]:
        return [line for i in self.inputs if (line := i.setup_failure()) is not None]

    def night_problems(self) -> list[str]:
        """The night's own red lines: a run that did not complete, each arch job that could not test, each run
        whose vLLM under test was broken."""
        run = [f"the nightly run {BAD_CONCLUSIONS[self.conclusion]}"] if self.conclusion in BAD_CONCLUSIONS else []
        return run + self.setup_failures() + self.vllm_broken()

    def reasons(self) -> list[str]:
        """Why the night is red, most urgent first (empty: green)."""
        d, out = self.diff, self.night_problems()
        if d["archs_lost"]:
            out.append(f"no results at all from {', '.join(d['archs_lost'])}")
        red = sum(c.outcome in RED for c in self.cases.values())
        untested = sum(len(d[k]) for k in LOST)
        if red or untested:
            out.append(f"{len(d['new_failures'])} new failures, {len(d['still_failing'])} still failing, "
                       f"{len(d['newly_skipped']) + len(d['newly_missing'])} newly untested, "
                       f"{len(d['still_skipped']) + len(d['still_missing'])} still untested")
        if diverged := self.diverged():
            out.append(f"{diverged} cross-arch divergences outside the top-k")
        return out

    def lost(self) -> list[str]:
        """The keys of the cases untested tonight with nothing to say why (LOST), sorted."""
        return sorted({k for tag in LOST for k in self.diff[tag]})

    def headline(self) -> str:
        """The night's verdict in one line: the job log's, matrix.md's and the page's."""
        reasons = self.reasons()
        return "❌ " + "; ".join(reasons) if reasons else "✅ nothing is failing and nothing stopped being tested"

    def reported(self) -> list[str]:
        """Who reported, and when: `sm120 (rtx-pro-6000) at 2026-12-02T02:40:11`, one per file with results."""
        out = []
        for i in self.inputs:
            if i.setup_failure() is None:
                p = {**i.common, **i.properties}
                runner = f" ({p[P.RUNNER]})" if p.get(P.RUNNER) else ""
                out.append(f"{', '.join(i.archs) or 'no cases'}{runner} at {i.stamp or 'an unknown time'}")
        return out

    def diverged(self) -> int:
        """Cross-arch disagreements outside the top-k (report.crossarch): red like a failure."""
        return sum(x["red"] for d in self.disagreements for x in d["differs"])


@dataclasses.dataclass
class Grid:
    """checkpoint rows x (arch, mode) columns, each cell holding its cases."""

    rows: list[str]
    schemes: dict[str, str]
    cols: list[tuple[str, str]]
    cells: dict[tuple[str, str, str], list[CaseResult]]


def grid(report: NightReport) -> Grid:
    """Computed once and shared by matrix.md and index.html, which show the same grid."""
    cells: dict[tuple[str, str, str], list[CaseResult]] = {}
    for c in report.cases.values():
        cell = c.axes[:3]
        if cell in cells:
            cells[cell].append(c)
        else:
            cells[cell] = [c]
    schemes: dict[str, str] = {}
    for (checkpoint, _, _), members in cells.items():
        if checkpoint not in schemes:
            scheme = next((c.axes[4] for c in members if c.axes[4]), None)
            if scheme:
                schemes[checkpoint] = scheme
    rows = sorted({k[0] for k in cells}, key=lambda r: (r == NONE, natural(r)))
    cols = sorted({k[1:] for k in cells},
                  key=lambda am: (am[0] == NONE, natural(am[0]), am[1] != "default", am[1]))
    return Grid(rows, schemes, cols, cells)


def cell_status(cases: list[CaseResult]) -> str:
    """Worst first: a failure (or greedy tokens outside another arch's top-k), then lost coverage, then a waiver;
    a cell of skips only is `skip`."""
    outcomes = {c.outcome for c in cases}
    if outcomes & RED or any(DIVERGED in c.tags for c in cases):
        return "fail"
    if any(c.tags & LOST for c in cases):
        return "lost"
    if "waived" in outcomes:
        return "waived"
    return "pass" if outcomes & PASS else "skip"


def natural(s: str) -> tuple:
    """sm90 < sm100 < sm120 < sm121: numbers compare as numbers."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", s) if p)
