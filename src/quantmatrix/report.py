"""Nightly report: merge the per-arch JUnit files, diff against last night, write summary/matrix/page.

Each self-hosted runner leaves one JUnit file for its arch. This module folds them into one model (reruns
included), diffs it against the previous night's summary.json, compares greedy outputs across archs and
writes summary.json (tomorrow's --previous), matrix.md and a self-contained index.html. The exit code
tells a nightly job whether anything broke or stopped being tested.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from junitparser import Error, Failure, JUnitXml, JUnitXmlError
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


class ReportError(QuantmatrixError):
    """The report cannot be made as asked (bad arguments, unreadable previous summary)."""


# --------------------------------------------------------------------------------------------- model


@dataclasses.dataclass(slots=True)
class Case:
    """One test case after folding its attempts; `props` are its per-case JUnit properties."""

    key: str
    outcome: str
    props: dict[str, str]
    message: str = ""
    log_tail: str = ""
    time: float = 0.0
    file: int | None = None
    attempts: list[str] = dataclasses.field(default_factory=list)
    history: list[list[str | None] | None] = dataclasses.field(default_factory=list)
    tags: set[str] = dataclasses.field(default_factory=set)
    axes: tuple[str, str, str, str, str] = ("", "", "", "", "")  # checkpoint, arch, mode, check, scheme

    @property
    def checkpoint(self) -> str:
        return self.axes[0]

    @property
    def arch(self) -> str:
        return self.axes[1]

    @property
    def mode(self) -> str:
        return self.axes[2]

    @property
    def check(self) -> str:
        return self.axes[3]


@dataclasses.dataclass
class Input:
    """One JUnit file that was merged: its host-level properties and the case properties all its cases share."""

    path: str
    cases: int
    properties: dict[str, str]
    common: dict[str, str]


@dataclasses.dataclass
class Report:
    night: str
    date: str
    previous_night: str | None
    history_nights: int
    nights: list[dict[str, str]]
    inputs: list[Input]
    bad_inputs: list[dict[str, str]]
    cases: dict[str, Case]
    diff: dict[str, Any]
    disagreements: list[dict[str, Any]]

    def vllm_version(self, case: Case) -> str | None:
        v = case.props.get("vllm_version")
        if v is None and case.file is not None:
            v = self.inputs[case.file].properties.get("vllm_version")
        return v

    def totals(self) -> dict[str, int]:
        out = dict.fromkeys(OUTCOMES, 0)
        for c in self.cases.values():
            out[c.outcome] += 1
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
    schemes: dict[str, str] = {}
    for c in report.cases.values():
        cells.setdefault((c.checkpoint, c.arch, c.mode), []).append(c)
        if c.axes[4]:
            schemes.setdefault(c.checkpoint, c.axes[4])
    rows = sorted({k[0] for k in cells}, key=natural)
    cols = sorted({k[1:] for k in cells}, key=lambda am: (natural(am[0]), mode_key(am[1])))
    return Grid(rows, schemes, cols, cells)


def cell_status(cases: list[Case]) -> str:
    """Worst first: a failure, then lost coverage, then a waiver; a cell of skips only is `skip`."""
    outcomes = {c.outcome for c in cases}
    tags = set().union(*(c.tags for c in cases))
    if outcomes & RED:
        return "fail"
    if tags & LOST:
        return "lost"
    if "waived" in outcomes:
        return "waived"
    return "pass" if outcomes & PASS else "skip"


def natural(s: str) -> tuple:
    """sm90 < sm100 < sm120 < sm121: numbers compare as numbers."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", s) if p)


def mode_key(mode: str) -> tuple[bool, str]:
    return (mode != "default", mode)


# ------------------------------------------------------------------------------------------- reading


@dataclasses.dataclass
class _FileRead:
    path: str
    problem: str | None = None
    properties: dict[str, str] = dataclasses.field(default_factory=dict)
    common: dict[str, str] = dataclasses.field(default_factory=dict)
    # key, outcome, message, log tail, time, own properties, suite timestamp
    rows: list[tuple[str, str, str, str, float, dict[str, str], str]] = dataclasses.field(default_factory=list)


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
    """Map a junitparser TestCase to (outcome, message, log tail), honouring waivers."""
    results = case.result
    message, log = "", ""
    bad = [r for r in results if isinstance(r, (Failure, Error))]
    if bad:
        outcome = "failed" if any(isinstance(r, Failure) for r in bad) else "error"
        message = "\n".join(r.message or "" for r in bad)
        log = _tail(*(r.text for r in bad), case.system_out, case.system_err)
    elif results:
        r = results[0]
        message = r.message or ""
        if r.type == "pytest.xfail":
            outcome = "waived"
        elif message == "xfail-marked test passes unexpectedly":
            outcome = "xpassed"
        else:
            outcome = "skipped"
    else:
        outcome = "xpassed" if "waiver_reason" in props else "passed"
    if outcome in ("waived", "xpassed", "passed") and "waiver_reason" in props and \
            _waiver_expired(props, today):
        outcome = "failed"
        message = f"waiver expired {props.get('waiver_expires', '')}: {props['waiver_reason']}" + \
                  (f" ({props['waiver_link']})" if props.get("waiver_link") else "") + \
                  (f"\n{message}" if message else "")
    return outcome, message[:MESSAGE_CHARS], log


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
    for suite in xml:
        out.properties.update((p.name, p.value) for p in suite.properties())
        stamp = suite.timestamp or ""
        for case in suite:
            # junitparser 5 has no per-case properties API, and wrapping each <property> in its objects
            # costs ~7 s per 100k cases, so the <properties> element is read directly.
            props: dict[str, str] = {}
            has_result = False
            for child in case._elem:
                if child.tag == "properties":
                    for p in child:
                        props[p.get("name", "")] = p.get("value", "")
                elif child.tag in ("failure", "error", "skipped"):
                    has_result = True
            if has_result or "waiver_reason" in props:
                outcome, message, log = _outcome(case, props, today)
            else:
                outcome, message, log = "passed", "", ""
            out.rows.append((f"{case.classname or ''}::{case.name or ''}", outcome, message, log,
                             case.time or 0.0, props, stamp))
            per_case.append(props)
    if per_case:
        common = dict(per_case[0])
        for props in per_case[1:]:
            for k in [k for k, v in common.items() if props.get(k) != v]:
                del common[k]
        out.common = common
        if common:
            out.rows = [(k, o, m, lg, t, {n: v for n, v in p.items() if n not in common}, s)
                        for k, o, m, lg, t, p, s in out.rows]
    return out


def _read_many(paths: list[str], today: datetime.date | None, jobs: int) -> list[_FileRead]:
    """Parse files in worker processes once there are enough of them to pay for starting the workers."""
    jobs = min(jobs, len(paths) // 16)
    if jobs <= 1:
        return [_read(p, today) for p in paths]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_read, paths, [today] * len(paths), chunksize=max(1, len(paths) // (jobs * 4))))


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


_RANK = {"error": 6, "failed": 5, "waived": 4, "xpassed": 3, "skipped": 2, "passed": 1}


def _fold(reads: list[_FileRead]) -> tuple[list[Input], list[dict[str, str]], dict[str, Case]]:
    """Merge the files; a case seen more than once is folded, the latest attempt deciding its outcome.

    Two entries for one case inside one file are one attempt (pytest writes a call failure and a teardown
    error as two <testcase>s), so they combine; entries in different files are reruns, ordered by time.
    """
    inputs: list[Input] = []
    bad: list[dict[str, str]] = []
    seen: dict[str, list[tuple[float, int, tuple]]] = {}
    for read in reads:
        if read.problem:
            bad.append({"path": read.path, "problem": read.problem})
            continue
        idx = len(inputs)
        inputs.append(Input(read.path, len(read.rows), read.properties, read.common))
        for row in read.rows:
            seen.setdefault(row[0], []).append((0.0, idx, row))
    cases: dict[str, Case] = {}
    for key, entries in seen.items():
        if len(entries) == 1:
            _, idx, (_, outcome, message, log, time, own, _) = entries[0]
            cases[key] = Case(key, outcome, {**inputs[idx].common, **own} if inputs[idx].common else own,
                              message, log, time, idx, [outcome])
            continue
        attempts: dict[int, list[tuple]] = {}
        for _, idx, row in entries:
            attempts.setdefault(idx, []).append(row)
        ordered = sorted(attempts.items(), key=lambda a: (_timestamp(a[1][0][6]), a[0]))
        outcomes = []
        for idx, rows in ordered:
            worst = max(rows, key=lambda r: _RANK[r[1]])
            outcomes.append(worst[1])
        idx, rows = ordered[-1]
        worst = max(rows, key=lambda r: _RANK[r[1]])
        message = "\n".join(r[2] for r in rows if r[2])
        log = _tail(*(r[3] for r in rows))
        cases[key] = Case(key, worst[1], {**inputs[idx].common, **worst[5]}, message, log,
                          sum(r[4] for r in rows), idx, outcomes)
        if any(o in RED for o in outcomes) and any(o in PASS for o in outcomes):
            cases[key].tags.add("flaky")
    return inputs, bad, cases


def _axes(case: Case) -> tuple[str, str, str, str, str]:
    """checkpoint, arch, mode, check, scheme: from the plugin's properties, else from the case name."""
    p = case.props
    name = case.key.rpartition("::")[2]
    func, _, param = name.partition("[")
    m = _CELL.match(p.get("cell") or param.rstrip("]"))
    parsed = m.groupdict() if m else {}
    check = p.get("check") or func.removeprefix("test_")
    return (p.get("checkpoint") or parsed.get("checkpoint", "(none)"), p.get("arch") or parsed.get("arch", "(none)"),
            p.get("mode") or parsed.get("mode", "(none)"), check, p.get("scheme", ""))


# -------------------------------------------------------------------------------------- previous night


@dataclasses.dataclass
class Previous:
    night: str
    date: str
    nights: list[dict[str, str]]
    cases: dict[str, dict[str, Any]]  # key -> {"outcome", "vllm", "props", "history"}


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
        inputs = data["inputs"]
        cases = {}
        for key, c in data["cases"].items():
            props = c.get("properties", {})
            if c.get("file") is not None:
                inp = inputs[c["file"]]
                props = {**inp["common"], **props}
                vllm = props.get("vllm_version", inp["properties"].get("vllm_version"))
            else:
                vllm = props.get("vllm_version")
            cases[key] = {"outcome": c["outcome"], "vllm": vllm, "props": props, "history": c.get("history", [])}
        return Previous(data["night"], data["date"], data["nights"], cases)
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise ReportError(f"{path}: previous summary is malformed ({type(e).__name__}: {e})") from None


def _alternates(outcomes: Iterable[str | None]) -> bool:
    """Flaky over nights: the pass/fail sequence (skips ignored) changes direction at least twice."""
    seq = [o in PASS for o in outcomes if o in PASS or o in RED]
    return sum(a != b for a, b in zip(seq, seq[1:])) >= 2


def _diff(cases: dict[str, Case], prev: Previous | None, history: int) -> dict[str, Any]:
    """Tag every case against last night and carry what vanished as `missing` (a coverage loss)."""
    d: dict[str, Any] = {k: [] for k in ("new_failures", "still_failing", "fixed", "newly_skipped",
                                         "newly_missing", "still_missing", "flaky")}
    bisect: dict[str, dict[str, Any]] = {}
    pcases = prev.cases if prev else {}
    nights = ([{"night": prev.night, "date": prev.date}] + prev.nights)[:history] if prev else []
    for key, p in pcases.items():
        if key in cases:
            continue
        hist = ([[p["outcome"], p["vllm"]]] + p["history"])[:history]
        if any(h and h[0] in RAN | {"skipped"} for h in hist):
            last = next(nights[i]["night"] for i, h in enumerate(hist) if h and h[0] != "missing")
            cases[key] = Case(key, "missing", p["props"], f"no result tonight (last result: {last})")
    for key, c in cases.items():
        p = pcases.get(key)
        if p is not None:
            c.history = ([[p["outcome"], p["vllm"]]] + p["history"])[:history]
        before = p["outcome"] if p else None
        now = c.outcome
        if now in RED:
            if before in RED:
                c.tags.add("still_failing")
            else:
                c.tags.add("new_failure")
                last = next((i for i, h in enumerate(c.history) if h and h[0] in PASS), None)
                if prev is not None:  # the first night has nothing to bisect against
                    bisect[key] = {"last_passed_night": nights[last]["night"] if last is not None else None,
                                   "last_passed_vllm": c.history[last][1] if last is not None else None}
        elif now in PASS and before in RED:
            c.tags.add("fixed")
        elif now == "skipped" and before in RAN:
            c.tags.add("newly_skipped")
        elif now == "missing":
            c.tags.add("still_missing" if before == "missing" else "newly_missing")
        if _alternates([now] + [h[0] if h else None for h in c.history]):
            c.tags.add("flaky")
        for tag in c.tags:
            d[{"new_failure": "new_failures"}.get(tag, tag)].append(key)
    for v in d.values():
        v.sort()
    d["bisect"] = bisect
    had = {c["props"].get("arch") for c in pcases.values() if c["outcome"] != "missing"}
    have = {c.arch for c in cases.values() if c.outcome != "missing"}
    d["archs_lost"] = sorted(a for a in had - have if a)
    d["nights"] = nights
    return d


# ------------------------------------------------------------------------------- cross-arch agreement


def _tokens(raw: str) -> list[list[int]] | str:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    ok = isinstance(value, list) and all(isinstance(s, list) and all(type(t) is int for t in s) for s in value)
    return value if ok else raw


def _divergence(a: list[list[int]] | str, b: list[list[int]] | str) -> str:
    if isinstance(a, str) or isinstance(b, str):
        return "greedy_token_ids is not a JSON list of lists of ints"
    if len(a) != len(b):
        return f"{len(b)} prompts vs {len(a)}"
    for i, (sa, sb) in enumerate(zip(a, b)):
        for j, (ta, tb) in enumerate(zip(sa, sb)):
            if ta != tb:
                return f"prompt {i} diverges at token {j}: {tb} vs {ta}"
        if len(sa) != len(sb):
            return f"prompt {i}: {len(sb)} tokens vs {len(sa)}"
    return "outputs differ"


def _agreement(cases: Iterable[Case]) -> list[dict[str, Any]]:
    """Same checkpoint, mode and check on different archs must produce the same greedy tokens."""
    groups: dict[tuple[str, str, str], list[Case]] = {}
    for c in cases:
        if "greedy_token_ids" in c.props and c.outcome != "missing":
            groups.setdefault((c.checkpoint, c.mode, c.check), []).append(c)
    out = []
    for (checkpoint, mode, check), members in sorted(groups.items()):
        by_output: dict[str, list[Case]] = {}
        for c in sorted(members, key=lambda c: natural(c.arch)):
            tokens = _tokens(c.props["greedy_token_ids"])
            by_output.setdefault(json.dumps(tokens), []).append(c)
        if len(by_output) < 2:
            continue
        ref_key, ref = max(by_output.items(), key=lambda kv: len(kv[1]))
        ref_tokens = _tokens(ref[0].props["greedy_token_ids"])
        differs = []
        for k, group in by_output.items():
            if k == ref_key:
                continue
            for c in group:
                c.tags.add("disagree")
                differs.append({"arch": c.arch, "device": c.props.get("device_name", ""), "case": c.key,
                                "detail": _divergence(ref_tokens, _tokens(c.props["greedy_token_ids"]))})
        out.append({"checkpoint": checkpoint, "mode": mode, "check": check,
                    "reference": [{"arch": c.arch, "device": c.props.get("device_name", ""), "case": c.key}
                                  for c in ref], "differs": differs})
    return out


def _who(entry: Mapping[str, str]) -> str:
    return f"{entry['arch']} ({entry['device']})" if entry["device"] else entry["arch"]


def describe_disagreement(d: Mapping[str, Any]) -> str:
    """One line a maintainer can read: 'sm121 (NVIDIA GB10) differs from sm120 (RTX PRO 6000): ...'."""
    ref = ", ".join(_who(r) for r in d["reference"])
    head = f"{d['checkpoint']} / {d['mode']} / {d['check']}: "
    return head + "; ".join(f"{_who(x)} differs from {ref}: {x['detail']}" for x in d["differs"])


# --------------------------------------------------------------------------------------------- build


def build(paths: list[str], previous: Previous | None, *, night: str, date: datetime.date, history: int = 7,
          jobs: int = 1, bad: list[dict[str, str]] | None = None) -> Report:
    """Merge `paths`, diff against `previous` and compare archs; the whole model, nothing written yet."""
    if previous is not None and previous.night == night:
        raise ReportError(f"the previous summary is for night {night!r} too; pass last night's summary.json "
                          "or name this run with --night")
    reads = _read_many(paths, date, jobs)
    inputs, bad_files, cases = _fold(reads)
    for c in cases.values():
        c.axes = _axes(c)
    diff = _diff(cases, previous, history)
    for c in cases.values():
        if c.outcome == "missing":
            c.axes = _axes(c)
    disagreements = _agreement(cases.values())
    return Report(night, date.isoformat(), previous.night if previous else None, history, diff.pop("nights"),
                  inputs, (bad or []) + bad_files, cases, diff, disagreements)


def summary(report: Report) -> dict[str, Any]:
    """summary.json: versioned, and enough history in it for tomorrow's diff to need nothing else."""
    cases: dict[str, Any] = {}
    for key in sorted(report.cases):
        c = report.cases[key]
        entry: dict[str, Any] = {"outcome": c.outcome}
        if c.file is not None:
            common = report.inputs[c.file].common
            entry["file"] = c.file
            entry["properties"] = {k: v for k, v in c.props.items() if k not in common} if common else c.props
        else:
            entry["properties"] = c.props
        if c.message:
            entry["message"] = c.message
        if c.log_tail:
            entry["log_tail"] = c.log_tail
        if c.time:
            entry["time"] = c.time
        if len(c.attempts) > 1:
            entry["attempts"] = c.attempts
        if c.history:
            entry["history"] = c.history
        cases[key] = entry
    return {
        "schema": SCHEMA, "generated_by": "quantmatrix report", "night": report.night, "date": report.date,
        "previous_night": report.previous_night, "history_nights": report.history_nights,
        "nights": report.nights, "exit_code": report.exit_code, "totals": report.totals(),
        "inputs": [dataclasses.asdict(i) for i in report.inputs], "bad_inputs": report.bad_inputs,
        "diff": report.diff, "disagreements": report.disagreements, "cases": cases,
    }


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


def write(report: Report, out: Path) -> dict[str, Path]:
    from quantmatrix import report_html, report_md

    out.mkdir(parents=True, exist_ok=True)
    paths = {"summary": out / "summary.json", "matrix": out / "matrix.md", "html": out / "index.html"}
    write_atomic(paths["summary"], json.dumps(summary(report), separators=(",", ":")))
    write_atomic(paths["matrix"], report_md.render(report))
    write_atomic(paths["html"], report_html.render(report))
    return paths


# ------------------------------------------------------------------------------------------------ CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quantmatrix report", description="Merge nightly JUnit files into "
                                "summary.json, matrix.md and index.html, diffed against the previous night.")
    p.add_argument("inputs", nargs="+", metavar="RUN_DIRS_OR_FILES",
                   help="JUnit files, or run directories searched recursively for *.xml")
    p.add_argument("--out", required=True, type=Path, help="directory for summary.json, matrix.md, index.html")
    p.add_argument("--previous", metavar="SUMMARY", help="last night's summary.json")
    p.add_argument("--history", type=int, default=7, metavar="N", help="nights of history kept (default 7)")
    p.add_argument("--date", help="date of this run, YYYY-MM-DD (default: today)")
    p.add_argument("--night", help="label of this run (default: the date)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel parsers (default: CPUs)")
    return p


def main(argv: list[str] | None = None) -> int:
    """0: nothing new broke and nothing stopped being tested; 1: it did; 2: the command was wrong."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    try:
        if args.history < 1:
            raise ReportError(f"--history must be at least 1, got {args.history}")
        try:
            date = datetime.date.fromisoformat(args.date) if args.date else datetime.date.today()
        except ValueError:
            raise ReportError(f"--date: expected YYYY-MM-DD, got {args.date!r}") from None
        previous = load_previous(args.previous) if args.previous else None
        files, bad = find_inputs(args.inputs)
        report = build(files, previous, night=args.night or date.isoformat(), date=date,
                       history=args.history, jobs=max(1, args.jobs), bad=bad)
        paths = write(report, args.out)
    except QuantmatrixError as e:
        print(f"quantmatrix report: error: {e}", file=sys.stderr)
        return 2
    d = report.diff
    print(f"quantmatrix report: {len(report.inputs)} files ({len(report.bad_inputs)} bad), "
          f"{len(report.cases)} cases: {len(d['new_failures'])} new failures, {len(d['still_failing'])} still "
          f"failing, {len(d['fixed'])} fixed, {len(d['newly_skipped']) + len(d['newly_missing'])} newly "
          f"untested, {len(d['flaky'])} flaky, {len(report.disagreements)} cross-arch disagreements "
          f"-> {paths['html']}")
    return report.exit_code

