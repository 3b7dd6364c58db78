"""Nightly report: merge the per-arch JUnit files, diff against last night, write summary/matrix/page.

Each self-hosted runner leaves one JUnit file for its arch. This module folds them into one model (reruns
included), diffs it against the previous night's summary.json, compares greedy outputs across archs and
writes summary.json (tomorrow's --previous), matrix.md and a self-contained index.html. The exit code
tells a nightly job whether anything broke or stopped being tested.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import gc
import json
import multiprocessing
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from junitparser import Error, Failure, JUnitXml, JUnitXmlError, TestCase
from junitparser import junitparser as _jp

from quantmatrix.errors import QuantmatrixError

SCHEMA = 1
PASS = frozenset({"passed", "xpassed"})
RED = frozenset({"failed", "error"})
RAN = PASS | RED | {"waived"}
LOST = frozenset({"newly_skipped", "newly_missing", "still_missing"})
OUTCOMES = ("failed", "error", "missing", "skipped", "waived", "xpassed", "passed")
LOG_LINES, LOG_CHARS, MESSAGE_CHARS = 40, 4000, 1000
# junitparser parses with lxml when it is installed, else with the standard library.
_PARSE_ERRORS = (_jp.etree.ParseError, ET.ParseError)
_CELL = re.compile(r"(?P<checkpoint>[^@\[\]]+)@(?P<arch>[A-Za-z0-9_]+)-(?P<mode>[A-Za-z0-9_]+)\Z")
NONE = "(none)"  # the axis value of a case that names no cell; sorted last
_COMPACT = json.JSONEncoder(separators=(",", ":")).encode  # one encoder, not one per call
_STR = json.encoder.encode_basestring_ascii  # a str as json.dumps writes it, without its per-call setup
_RANK = {"error": 6, "failed": 5, "waived": 4, "xpassed": 3, "skipped": 2, "passed": 1}

Axes = tuple[str, str, str, str, str]  # checkpoint, arch, mode, check, scheme


class ReportError(QuantmatrixError):
    """The report cannot be made as asked (bad arguments, unreadable previous summary)."""


# --------------------------------------------------------------------------------------------- model


@dataclasses.dataclass(slots=True)
class Case:
    """One test case after folding its attempts.

    Its JUnit properties are split in `own` and `common` (those every case of its file shares, one object
    per file) because 100k cases x 20 properties would otherwise dominate memory and summary.json.
    """

    key: str
    outcome: str
    own: dict[str, str]
    common: dict[str, str]
    axes: Axes
    entry: str  # its `"key":{...}` member of summary.json: _entry(), completed by seal()
    message: str = ""
    log_tail: str = ""
    time: float = 0.0
    file: int | None = None
    # Immutable defaults: most of 100k cases never get attempts, history or tags, and allocating empty
    # containers for each of them is a measurable part of the 5 s budget.
    attempts: tuple[str, ...] = ()
    history: str = ""  # see history_entries()
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
            entry += f',"history":{_STR(self.history)}'
        if self.attempts:
            entry += f',"attempts":{_COMPACT(list(self.attempts))}'
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
class Report:
    night: str
    date: str
    previous_night: str | None
    history_nights: int
    nights: list[dict[str, str]]  # newest first, aligned with every Case.history
    inputs: list[Input]
    bad_inputs: list[dict[str, str]]
    cases: dict[str, Case]
    diff: dict[str, Any]
    disagreements: list[dict[str, Any]]

    def vllm_version(self, case: Case) -> str | None:
        v = case.prop("vllm_version")
        if v is None and case.file is not None:
            v = self.inputs[case.file].properties.get("vllm_version")
        return v

    def totals(self) -> dict[str, int]:
        out = dict.fromkeys(OUTCOMES, 0)
        out.update(collections.Counter(c.outcome for c in self.cases.values()))
        return out

    @property
    def exit_code(self) -> int:
        """1 when something broke or stopped being tested since last night."""
        d = self.diff
        return 1 if d["new_failures"] or d["newly_skipped"] or d["newly_missing"] else 0


@dataclasses.dataclass
class Grid:
    """checkpoint rows x (arch, mode) columns, each cell holding its cases."""

    rows: list[str]
    schemes: dict[str, str]
    cols: list[tuple[str, str]]
    cells: dict[tuple[str, str, str], list[Case]]


def grid(report: Report) -> Grid:
    cells: dict[tuple[str, str, str], list[Case]] = {}
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


def cell_status(cases: list[Case]) -> str:
    """Worst first: a failure, then lost coverage, then a waiver; a cell of skips only is `skip`."""
    outcomes = {c.outcome for c in cases}
    if outcomes & RED:
        return "fail"
    if any(c.tags & LOST for c in cases):
        return "lost"
    if "waived" in outcomes:
        return "waived"
    return "pass" if outcomes & PASS else "skip"


def natural(s: str) -> tuple:
    """sm90 < sm100 < sm120 < sm121: numbers compare as numbers."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", s) if p)


# ------------------------------------------------------------------------------------------- reading


@dataclasses.dataclass
class _FileRead:
    path: str
    problem: str | None = None
    properties: dict[str, str] = dataclasses.field(default_factory=dict)
    common: dict[str, str] = dataclasses.field(default_factory=dict)
    # key, outcome, message, log tail, time, own properties, axes, suite timestamp, summary entry
    rows: list[tuple[str, str, str, str, float, dict[str, str], Axes, str, str]] = \
        dataclasses.field(default_factory=list)


def _tail(*texts: str | None) -> str:
    lines = "\n".join(t.rstrip() for t in texts if t and t.strip()).splitlines()
    return "\n".join(lines[-LOG_LINES:])[-LOG_CHARS:]


def _waiver_expired(props: Mapping[str, str], today: datetime.date | None) -> bool:
    if props.get("waiver_expired") == "true":
        return True
    try:
        return today is not None and today > datetime.date.fromisoformat(props.get("waiver_expires", ""))
    except ValueError:
        return False


def _outcome(case: Any, props: Mapping[str, str], today: datetime.date | None) -> tuple[str, str, str]:
    """Map a junitparser TestCase to (outcome, message, log tail); an expired waiver is a failure."""
    results = case.result
    message, log = "", ""
    bad = [r for r in results if isinstance(r, (Failure, Error))]
    if bad:
        outcome = "failed" if any(isinstance(r, Failure) for r in bad) else "error"
        message = "\n".join(r.message or "" for r in bad)
        log = _tail(*(r.text for r in bad), case.system_out, case.system_err)
    elif results:
        message = results[0].message or ""
        if results[0].type == "pytest.xfail":
            outcome = "waived"
        else:
            outcome = "xpassed" if message == "xfail-marked test passes unexpectedly" else "skipped"
    else:
        outcome = "xpassed" if "waiver_reason" in props else "passed"
    if outcome != "skipped" and "waiver_reason" in props and _waiver_expired(props, today):
        if "waiver expired" not in message:  # the plugin's own failure may say so already
            link = f" ({props['waiver_link']})" if props.get("waiver_link") else ""
            message = (f"waiver expired {props.get('waiver_expires', '')}: {props['waiver_reason']}{link}"
                       + (f"\n{message}" if message else ""))
        outcome = outcome if outcome in RED else "failed"
    return outcome, message[:MESSAGE_CHARS], log


def _axes(key: str, props: Mapping[str, str]) -> Axes:
    """checkpoint, arch, mode, check, scheme: from the plugin's properties, else from the case name."""
    check, ck, arch, mode = props.get("check"), props.get("checkpoint"), props.get("arch"), props.get("mode")
    if not (check and ck and arch and mode):  # not all from the plugin: read the case's name
        func, _, param = key.rpartition("::")[2].partition("[")
        check = check or func.removeprefix("test_")
        if not (ck and arch and mode):
            m = _CELL.match(props.get("cell") or param.rstrip("]"))
            parsed = m.groupdict() if m else {}
            ck, arch, mode = (ck or parsed.get("checkpoint", NONE), arch or parsed.get("arch", NONE),
                              mode or parsed.get("mode", NONE))
    # interned: a file's 100 cases then share 5 strings, which pickle sends from a worker once, not 100 times
    intern = sys.intern
    return intern(ck), intern(arch), intern(mode), intern(check), intern(props.get("scheme", ""))


def _read(path: str, today: datetime.date | None = None) -> _FileRead:
    """Read one JUnit file; any problem is reported, never raised, so the other files still merge."""
    out = _FileRead(path)
    try:
        if os.path.getsize(path) == 0:
            out.problem = "empty file"
            return out
        xml = JUnitXml.fromfile(path)
    except OSError as e:
        out.problem = f"cannot read: {e.strerror}"
        return out
    except _PARSE_ERRORS as e:
        out.problem = f"not well-formed XML (truncated?): {e}"
        return out
    except JUnitXmlError:
        out.problem = "not a JUnit file: the root element is neither <testsuites> nor <testsuite>"
        return out
    per_case: list[dict[str, str]] = []
    intern = sys.intern  # property names recur in every case: one object each, pickled once, kept once
    for suite in xml:
        out.properties.update((p.name, p.value) for p in suite.properties())
        stamp = suite.timestamp or ""
        for elem in _testcases(suite._elem):
            # junitparser 5 has no per-case properties API, and wrapping each <testcase> and <property>
            # in its objects costs seconds per 100k cases: the elements are read directly, and only a case
            # with a result (a few percent) is wrapped for junitparser to read its results.
            props: dict[str, str] = {}
            has_result = False
            for child in elem:
                tag = child.tag
                if tag == "properties":
                    for p in child:
                        props[intern(p.get("name", ""))] = p.get("value", "")
                elif tag == "failure" or tag == "error" or tag == "skipped":
                    has_result = True
            key = f"{elem.get('classname', '')}::{elem.get('name', '')}"
            if has_result or "waiver_reason" in props:
                outcome, message, log = _outcome(TestCase.fromelem(elem), props, today)
            else:
                outcome, message, log = "passed", "", ""
            try:
                seconds = float(elem.get("time") or 0)
            except ValueError:
                seconds = 0.0
            out.rows.append((key, outcome, message, log, seconds, props, _axes(key, props), stamp))
            per_case.append(props)
    if per_case:
        shared = per_case[0].items() & per_case[-1].items()
        for props in per_case:
            shared &= props.items()
        out.common = dict(shared)
        for props in per_case if shared else ():
            for k in out.common:
                del props[k]
    out.rows = [(*row, _entry(row[0], row[1], row[5], row[4], row[2], row[3])) for row in out.rows]
    return out


def _testcases(suite: ET.Element) -> Iterator[ET.Element]:
    """A suite's <testcase>s, then those of its nested suites, in junitparser's order."""
    yield from suite.iterfind("testcase")
    for nested in suite.iterfind("testsuite"):
        yield from _testcases(nested)


def _entry(key: str, outcome: str, own: Mapping[str, str], seconds: float, message: str, log: str) -> str:
    """A case's `"key":{...` member of summary.json's cases as far as its own file tells (no closing brace).

    Made where the file is parsed (a worker process), so that writing 100k entries is joining strings.
    """
    entry: dict[str, Any] = {"outcome": outcome, "properties": own}
    if seconds:
        entry["time"] = seconds
    if message:
        entry["message"] = message
    if log:
        entry["log_tail"] = log
    return f"{_STR(key)}:{_COMPACT(entry)[:-1]}"


@contextlib.contextmanager
def _reading(paths: list[str], today: datetime.date | None, jobs: int) -> Iterator[Iterable[_FileRead]]:
    """The files, read in order. With several jobs (and enough files to pay for starting them) worker
    processes are already parsing when this yields, so the caller's own work overlaps theirs."""
    jobs = min(jobs, len(paths) // 16)
    if jobs <= 1:
        yield (_read(p, today) for p in paths)
        return
    pool = ProcessPoolExecutor(jobs)
    try:
        yield pool.map(_read, paths, [today] * len(paths), chunksize=max(1, len(paths) // (jobs * 8)))
    finally:
        pool.shutdown(cancel_futures=True)


def find_inputs(args: Iterable[str]) -> tuple[list[str], list[dict[str, str]]]:
    """Expand files and run dirs (searched recursively for *.xml); a dir with none is a bad input."""
    files: list[str] = []
    bad: list[dict[str, str]] = []
    for arg in args:
        p = Path(arg)
        if p.is_dir():
            found = sorted(str(f) for f in p.rglob("*.xml") if f.is_file())
            if not found:
                bad.append({"path": arg, "problem": "run directory holds no *.xml file"})
            files += found
        elif p.exists():
            files.append(str(p))
        else:
            raise ReportError(f"{arg}: no such file or directory")
    return list(dict.fromkeys(files)), bad


def _timestamp(stamp: str) -> float:
    try:
        return datetime.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0


@dataclasses.dataclass
class _Merged:
    inputs: list[Input]
    bad: list[dict[str, str]]
    cases: dict[str, Case]
    with_tokens: list[str]  # keys of the cases that stored greedy token ids, for the cross-arch comparison


def _fold(reads: Iterable[_FileRead], diff: _Diff) -> _Merged:
    """Merge the files; a case seen more than once is folded, its latest attempt deciding the outcome.

    Two entries for one case in one file are one attempt (pytest writes a call failure and a teardown
    error as two <testcase>s), so they combine; entries in different files are reruns, ordered by time.
    Each case is diffed as it arrives, while the workers still parse the files after it.
    """
    m = _Merged([], [], {}, [])
    inputs, cases, with_tokens = m.inputs, m.cases, m.with_tokens
    first: dict[str, tuple] = {}
    dups: dict[str, list[tuple[int, tuple]]] = {}
    for read in reads:
        if read.problem:
            m.bad.append({"path": read.path, "problem": read.problem})
            continue
        idx = len(inputs)
        archs = sorted({row[6][1] for row in read.rows}, key=natural)
        inputs.append(Input(read.path, len(read.rows), archs, read.properties, read.common))
        common = read.common
        tokens_common = "greedy_token_ids" in common
        for row in read.rows:
            key = row[0]
            if key in first:
                dups.setdefault(key, [(cases[key].file, first[key])]).append((idx, row))
                continue
            first[key] = row
            cases[key] = case = Case(key, row[1], row[5], common, row[6], row[8], row[2], row[3], row[4], idx)
            diff.case(case)
            if tokens_common or "greedy_token_ids" in row[5]:
                with_tokens.append(key)
    for key, entries in dups.items():
        attempts: dict[int, list[tuple]] = {}
        for idx, row in entries:
            attempts.setdefault(idx, []).append(row)
        ordered = sorted(attempts.items(), key=lambda a: (_timestamp(a[1][0][7]), a[0]))
        outcomes = [max(rows, key=lambda r: _RANK[r[1]])[1] for _, rows in ordered]
        idx, rows = ordered[-1]
        worst = max(rows, key=lambda r: _RANK[r[1]])
        message, log, seconds = "\n".join(r[2] for r in rows if r[2]), _tail(*(r[3] for r in rows)), \
            sum(r[4] for r in rows)
        case = Case(key, worst[1], worst[5], inputs[idx].common, worst[6],
                    _entry(key, worst[1], worst[5], seconds, message, log), message, log, seconds, idx,
                    tuple(outcomes) if len(outcomes) > 1 else ())
        if any(o in RED for o in outcomes) and any(o in PASS for o in outcomes):
            case.tag("flaky")
        cases[key] = case
        diff.case(case)  # the folded case replaces the first attempt, and its tags
        if case.prop("greedy_token_ids") is not None:
            with_tokens.append(key)
    return m


# -------------------------------------------------------------------------------------- previous night


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
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ReportError(f"{path}: cannot read previous summary: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: previous summary is not valid JSON: {e}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ReportError(f"{path}: not a quantmatrix summary of schema {SCHEMA} (schema: {got!r})")
    try:
        prev = Previous(str(data["night"]), str(data["date"]), list(data["nights"]), list(data["inputs"]),
                        dict(data["cases"]))
        for night in prev.nights:
            str(night["night"]), str(night["date"])
        for inp in prev.inputs:
            dict(inp["common"]), dict(inp["properties"])
        outcomes, files = frozenset(OUTCOMES), range(len(prev.inputs))
        for key, c in prev.cases.items():  # one pass, cheap checks: it runs for 100k cases a night
            f = c.get("file")
            if c["outcome"] not in outcomes or type(c["properties"]) is not dict or \
                    type(c.get("history", "")) is not str or not (f is None or (type(f) is int and f in files)):
                raise ValueError(f"case {key!r} has outcome {c['outcome']!r} or malformed properties, "
                                 "history or file")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise ReportError(f"{path}: previous summary is malformed ({type(e).__name__}: {e})") from None
    return prev


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


class _Diff:
    """Tags cases against last night one at a time (as they are merged), then carries what vanished as
    `missing` (a coverage loss) and lists every tag."""

    def __init__(self, prev: Previous | None, history: int) -> None:
        self.prev, self.keep = prev, history
        self.pcases = prev.cases if prev else {}
        self.nights = ([{"night": prev.night, "date": prev.date}] + prev.nights)[:history] if prev else []
        self.bisect: dict[str, dict[str, Any]] = {}
        # the vLLM version of each of last night's files, as history writes it (entries are space-separated)
        self.file_vllm = [_no_space(i["common"].get("vllm_version", i["properties"].get("vllm_version")))
                          for i in prev.inputs] if prev else []

    def _vllm(self, pc: Mapping[str, Any]) -> str | None:
        v = pc["properties"].get("vllm_version")
        if v is not None:
            return _no_space(v)
        f = pc.get("file")
        return self.file_vllm[f] if f is not None else None

    def case(self, c: Case) -> None:
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
            c.tag("still_missing" if before == "missing" else "newly_missing")
        if c.history and _alternates(now, c.history):
            c.tag("flaky")
        c.seal()

    def finish(self, m: _Merged) -> dict[str, Any]:
        cases = m.cases
        for key, pc in self.pcases.items():
            if key in cases:
                continue
            hist = [pc["outcome"]] + [o for o, _ in history_entries(pc.get("history", ""))][: self.keep - 1]
            seen = next((i for i, o in enumerate(hist) if o != "missing"), None)
            if seen is not None:  # a case without a result in any night kept is dropped
                props = self.prev.props(pc)  # type: ignore[union-attr]
                message = f"no result tonight (last result: {self.nights[seen]['night']})"
                cases[key] = c = Case(key, "missing", props, {}, _axes(key, props),
                                      _entry(key, "missing", props, 0.0, message, ""), message)
                self.case(c)
        d: dict[str, Any] = {k: [] for k in ("new_failures", "still_failing", "fixed", "newly_skipped",
                                             "newly_missing", "still_missing", "flaky")}
        for key, c in cases.items():
            for tag in c.tags:
                d["new_failures" if tag == "new_failure" else tag].append(key)
        for v in d.values():
            v.sort()
        d["bisect"] = dict(sorted(self.bisect.items()))
        have = {arch for i in m.inputs for arch in i.archs}
        d["archs_lost"] = sorted({c.arch for k in d["newly_missing"] + d["still_missing"]
                                  if (c := cases[k]).arch not in have}, key=natural)
        d["nights"] = self.nights
        return d


def _no_space(v: str | None) -> str | None:
    return "".join(v.split()) if v else None


# ------------------------------------------------------------------------------- cross-arch agreement


def _tokens(raw: str) -> list[list[int]] | None:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if isinstance(value, list) and all(isinstance(s, list) and all(type(t) is int for t in s) for s in value):
        return value
    return None


def _divergence(a: list[list[int]] | None, b: list[list[int]] | None) -> str:
    if a is None or b is None:
        return "greedy_token_ids is not a JSON list of lists of ints"
    if len(a) != len(b):
        return f"{len(b)} prompts vs {len(a)}"
    for i, (sa, sb) in enumerate(zip(a, b, strict=True)):
        j = next((j for j, (ta, tb) in enumerate(zip(sa, sb, strict=False)) if ta != tb), None)
        if j is not None:
            return f"prompt {i} diverges at token {j}: {sb[j]} vs {sa[j]}"
        if len(sa) != len(sb):
            return f"prompt {i}: {len(sb)} tokens vs {len(sa)}"
    return "outputs differ"


def _agreement(cases: Iterable[Case]) -> list[dict[str, Any]]:
    """Same checkpoint, mode and check on different archs must produce the same greedy tokens."""
    groups: dict[tuple[str, str, str], list[Case]] = {}
    for c in cases:
        if c.outcome != "missing" and c.prop("greedy_token_ids") is not None:
            groups.setdefault((c.checkpoint, c.mode, c.check), []).append(c)
    out = []
    for (checkpoint, mode, check), members in sorted(groups.items()):
        if len({c.prop("greedy_token_ids") for c in members}) < 2:
            continue  # identical text: the common case, decided without parsing
        by_output: dict[str, tuple[list[list[int]] | None, list[Case]]] = {}
        for c in sorted(members, key=lambda c: natural(c.arch)):
            tokens = _tokens(c.prop("greedy_token_ids") or "")
            same = json.dumps(tokens) if tokens is not None else f"unreadable:{c.key}"
            by_output.setdefault(same, (tokens, []))[1].append(c)
        if len(by_output) < 2:
            continue
        ref_key, (ref_tokens, ref) = max(by_output.items(), key=lambda kv: len(kv[1][1]))
        differs = []
        for k, (tokens, group) in by_output.items():
            for c in group if k != ref_key else ():
                c.tag("disagree")
                differs.append({"arch": c.arch, "device": c.prop("device_name", ""), "case": c.key,
                                "detail": _divergence(ref_tokens, tokens)})
        reference = [{"arch": c.arch, "device": c.prop("device_name", ""), "case": c.key} for c in ref]
        out.append({"checkpoint": checkpoint, "mode": mode, "check": check, "differs": differs,
                    "reference": reference})
    return out


def _who(entry: Mapping[str, str]) -> str:
    return f"{entry['arch']} ({entry['device']})" if entry["device"] else entry["arch"]


def describe_disagreement(d: Mapping[str, Any]) -> str:
    """One line a maintainer can read: 'sm121 (NVIDIA GB10) differs from sm120 (RTX PRO 6000): ...'."""
    ref = ", ".join(_who(r) for r in d["reference"])
    return f"{d['checkpoint']} / {d['mode']} / {d['check']}: " + "; ".join(
        f"{_who(x)} differs from {ref}: {x['detail']}" for x in d["differs"])


# --------------------------------------------------------------------------------------------- build


def build(paths: list[str], previous: str | Path | None, *, night: str, date: datetime.date, history: int = 7,
          jobs: int = 1, bad: list[dict[str, str]] | None = None) -> Report:
    """Merge `paths`, diff against the `previous` summary.json and compare archs; nothing written yet."""
    with _reading(paths, date, jobs) as reads:
        prev = load_previous(previous) if previous is not None else None  # while the workers parse
        if prev is not None and prev.night == night:
            raise ReportError(f"the previous summary is for night {night!r} too; pass last night's "
                              "summary.json or name this run with --night")
        differ = _Diff(prev, history)
        merged = _fold(reads, differ)
    diff = differ.finish(merged)
    cases = {k: merged.cases[k] for k in sorted(merged.cases)}  # every output lists cases in this order
    disagreements = _agreement(cases[k] for k in sorted(set(merged.with_tokens)))
    return Report(night, date.isoformat(), prev.night if prev else None, history, diff.pop("nights"),
                  merged.inputs, (bad or []) + merged.bad, cases, diff, disagreements)


def summary_json(report: Report) -> str:
    """summary.json: versioned, with enough history that tomorrow's diff needs nothing else."""
    head = json.dumps({
        "schema": SCHEMA, "generated_by": "quantmatrix report", "night": report.night, "date": report.date,
        "previous_night": report.previous_night, "history_nights": report.history_nights,
        "nights": report.nights, "exit_code": report.exit_code, "totals": report.totals(),
        "inputs": [{"path": i.path, "cases": i.cases, "archs": i.archs, "properties": i.properties,
                    "common": i.common} for i in report.inputs],
        "bad_inputs": report.bad_inputs, "diff": report.diff, "disagreements": report.disagreements,
    }, separators=(",", ":"))
    body = ",".join(c.entry for c in report.cases.values())
    return head[:-1] + ',"cases":{' + body + "}}"


# ---------------------------------------------------------------------------------------------- write


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a temp file beside `path`, then rename: readers see the old file or the new one, never half."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0o22)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)  # mkstemp makes 0600; keep the mode a plain open() would have given
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def stamp_testsuite_properties(xml_path: Path, props: Mapping[str, str]) -> None:
    """Add host-level <properties> to every <testsuite> of a finished JUnit file, atomically.

    record_testsuite_property is a no-op on xdist workers, so the controller stamps the file pytest wrote.
    Stamping twice updates values instead of repeating them.
    """
    xml_path = Path(xml_path)
    try:
        tree = ET.parse(xml_path)
    except (OSError, ET.ParseError) as e:
        raise QuantmatrixError(f"{xml_path}: cannot stamp suite properties: {e}") from None
    for suite in tree.getroot().iter("testsuite"):
        node = suite.find("properties")
        if node is None:
            node = ET.Element("properties")
            suite.insert(0, node)
        existing = {p.get("name"): p for p in node.iter("property")}
        for name, value in props.items():
            if name in existing:
                existing[name].set("value", str(value))
            else:
                ET.SubElement(node, "property", name=str(name), value=str(value))
    write_atomic(xml_path, ET.tostring(tree.getroot(), encoding="utf-8", xml_declaration=True))


def write(report: Report, out: Path, jobs: int = 1) -> dict[str, Path]:
    """Write the three outputs, each atomically; with jobs > 1 summary.json and matrix.md are written by a
    second process while this one renders the page."""
    from quantmatrix import report_html, report_md  # they import this module's model

    out.mkdir(parents=True, exist_ok=True)
    g = grid(report)
    paths = {"summary": out / "summary.json", "matrix": out / "matrix.md", "html": out / "index.html"}

    def summary_and_matrix() -> None:
        write_atomic(paths["summary"], summary_json(report))
        write_atomic(paths["matrix"], report_md.render(report, g))

    with _aside(jobs > 1, summary_and_matrix, "summary.json and matrix.md"):
        write_atomic(paths["html"], report_html.render(report, g))
    return paths


@contextlib.contextmanager
def _aside(parallel: bool, job: Callable[[], None], what: str) -> Iterator[None]:
    """Run `job` in a forked child while the body runs, else after it.

    Rendering the page and the other two outputs are each about half of the bench's serial tail, and on
    two cores the second one is idle then. A forked child sees the report copy-on-write: nothing is pickled.
    """
    if not parallel or "fork" not in multiprocessing.get_all_start_methods():
        yield
        job()
        return
    child = multiprocessing.get_context("fork").Process(target=job, name=f"quantmatrix report: {what}")
    child.start()
    try:
        yield
    finally:
        child.join()
    if child.exitcode != 0:
        raise ReportError(f"writing {what} failed in a child process (exit code {child.exitcode}); its "
                          "traceback is printed above")


# ------------------------------------------------------------------------------------------------ CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quantmatrix report", description="Merge nightly JUnit files into "
                                "summary.json, matrix.md and index.html, diffed against the previous night.")
    p.add_argument("inputs", nargs="+", metavar="RUN_DIRS_OR_FILES",
                   help="JUnit files, or run directories searched recursively for *.xml")
    p.add_argument("--out", required=True, type=Path, help="directory to write summary.json, matrix.md and "
                   "index.html to")
    p.add_argument("--previous", metavar="SUMMARY", help="last night's summary.json")
    p.add_argument("--history", type=int, default=7, metavar="N", help="nights of history kept (default 7)")
    p.add_argument("--date", help="date of this run, YYYY-MM-DD (default: today)")
    p.add_argument("--night", help="label of this run (default: the date)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel parsers (default: CPUs)")
    return p


def main(argv: list[str] | None = None) -> int:
    """0: nothing new broke and nothing stopped being tested; 1: it did; 2: the command was wrong."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    with _no_gc():
        return _run(args)


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """The model is a million long-lived objects without cycles: the cyclic GC's repeated full scans of
    them cost ~25% of the bench's main process and free nothing, so it is paused, then restored."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _run(args: argparse.Namespace) -> int:
    try:
        if args.history < 1:
            raise ReportError(f"--history must be at least 1, got {args.history}")
        try:
            date = datetime.date.fromisoformat(args.date) if args.date else datetime.date.today()
        except ValueError:
            raise ReportError(f"--date: expected YYYY-MM-DD, got {args.date!r}") from None
        files, bad = find_inputs(args.inputs)
        report = build(files, args.previous, night=args.night or date.isoformat(), date=date,
                       history=args.history, jobs=max(1, args.jobs), bad=bad)
        paths = write(report, args.out, max(1, args.jobs))
    except (QuantmatrixError, OSError) as e:
        print(f"quantmatrix report: error: {e}", file=sys.stderr)
        return 2
    d = report.diff
    untested = len(d["newly_skipped"]) + len(d["newly_missing"])
    print(f"quantmatrix report: {len(report.inputs)} files ({len(report.bad_inputs)} bad), "
          f"{len(report.cases)} cases: {len(d['new_failures'])} new failures, "
          f"{len(d['still_failing'])} still failing, "
          f"{len(d['fixed'])} fixed, {untested} newly untested, {len(d['flaky'])} flaky, "
          f"{len(report.disagreements)} cross-arch disagreements -> {paths['html']}")
    return report.exit_code
