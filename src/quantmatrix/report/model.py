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
LOST = frozenset({"newly_skipped", "newly_missing", "still_missing"})
DISAGREE, DIVERGED = "disagree", "diverged"  # case tags: any cross-arch difference; one outside the top-k (red)
OUTCOMES = ("failed", "error", "missing", "skipped", "waived", "xpassed", "passed")
NOT_TESTED = "not tested (vLLM broken)"
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
        a case that stopped being tested or is still untested, a provisioned arch with no results. Red stays red
        until it is fixed or waived, never just because it was already red last night."""
        d = self.diff
        red = any(c.outcome in RED for c in self.cases.values()) or self.diverged()
        lost = d["newly_skipped"] or d["newly_missing"] or d["still_missing"] or d["archs_lost"]
        return 1 if red or lost else 0

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
