"""Reading JUnit files: one file into rows (in worker processes when there are many), and the inputs given.

A file is read whole or reported as bad, never raised on, so one broken runner's file cannot stop the night.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import math
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple
from xml.etree import ElementTree as ET

from junitparser import Error, Failure, JUnitXml, JUnitXmlError, TestCase
from junitparser import junitparser as _jp

from quantmatrix import bounded
from quantmatrix import properties as P
from quantmatrix.errors import ReportError
from quantmatrix.report.model import LOG_CHARS, LOG_LINES, MESSAGE_CHARS, NONE, RED, Axes, summary_entry

# junitparser parses with lxml when it is installed, else with the standard library.
_PARSE_ERRORS = (_jp.etree.ParseError, ET.ParseError)
# checkpoint@arch-mode, then -layout for a layout other than the checkpoint's serving one (schema.model.Cell.id)
_CELL = re.compile(r"(?P<checkpoint>[^@\[\]]+)@(?P<arch>[A-Za-z0-9_]+)-(?P<mode>[A-Za-z0-9_]+)"
                   r"(?:-(?P<layout>[A-Za-z0-9_]+))?\Z")


class Row(NamedTuple):
    """One <testcase> of one file, read by field name (FileRead.__reduce__ sends it as a plain tuple)."""

    key: str
    outcome: str
    message: str
    log_tail: str
    time: float
    props: dict[str, str]  # its own properties: those all cases of the file share are in FileRead.common
    axes: Axes
    stamp: str  # its suite's timestamp, which orders reruns in different files
    entry: str  # its summary.json member, see model.summary_entry


@dataclasses.dataclass
class FileRead:
    """One JUnit file: its rows, or the problem that made it unreadable."""

    path: str
    problem: str | None = None
    properties: dict[str, str] = dataclasses.field(default_factory=dict)
    common: dict[str, str] = dataclasses.field(default_factory=dict)
    rows: list[Row] = dataclasses.field(default_factory=list)

    def __reduce__(self) -> tuple[Any, ...]:
        """The rows travel from a worker as plain tuples and become Rows again on arrival: pickle saves a
        plain tuple in C, but a NamedTuple through its class's reduce, which doubles the workers' pickling."""
        return _arrived, (self.path, self.problem, self.properties, self.common, [tuple(r) for r in self.rows])


def _arrived(path: str, problem: str | None, properties: dict[str, str], common: dict[str, str],
             rows: list[tuple[Any, ...]]) -> FileRead:
    return FileRead(path, problem, properties, common, list(map(Row._make, rows)))


def tail(*texts: str | None) -> str:
    """The last LOG_LINES lines (at most LOG_CHARS) of the non-blank texts: where a failure's cause is."""
    lines = "\n".join(t.rstrip() for t in texts if t and t.strip()).splitlines()
    return "\n".join(lines[-LOG_LINES:])[-LOG_CHARS:]


def _waiver_expired(props: Mapping[str, str], today: datetime.date | None) -> bool:
    if props.get(P.WAIVER_EXPIRED) == "true":
        return True
    try:
        return today is not None and today > datetime.date.fromisoformat(props.get(P.WAIVER_EXPIRES, ""))
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
        log = tail(*(r.text for r in bad), case.system_out, case.system_err)
    elif results:
        message = results[0].message or ""
        if results[0].type == "pytest.xfail":
            outcome = "waived"
        else:
            outcome = "xpassed" if message == "xfail-marked test passes unexpectedly" else "skipped"
    else:
        outcome = "xpassed" if P.WAIVER_REASON in props else "passed"
    if outcome != "skipped" and P.WAIVER_REASON in props and _waiver_expired(props, today):
        if "waiver expired" not in message:  # the plugin's own failure may say so already
            link = f" ({props[P.WAIVER_LINK]})" if props.get(P.WAIVER_LINK) else ""
            message = (f"waiver expired {props.get(P.WAIVER_EXPIRES, '')}: {props[P.WAIVER_REASON]}{link}"
                       + (f"\n{message}" if message else ""))
        outcome = outcome if outcome in RED else "failed"
    return outcome, message[:MESSAGE_CHARS], log


def axes_of(key: str, props: Mapping[str, str]) -> Axes:
    """checkpoint, arch, mode, check, scheme: from the plugin's properties, else from the case name. A case in a
    layout other than its checkpoint's serving one (its cell id ends in the layout) gets its own row,
    `checkpoint [tp2]`."""
    check, ck, arch, mode = props.get(P.CHECK), props.get(P.CHECKPOINT), props.get(P.ARCH), props.get(P.MODE)
    layout = props.get(P.LAYOUT)
    extra = layout is not None and props.get(P.CELL, "").endswith(f"-{layout}")
    if not (check and ck and arch and mode):  # not all from the plugin: read the case's name
        func, _, param = key.rpartition("::")[2].partition("[")
        check = check or func.removeprefix("test_")
        if not (ck and arch and mode):
            m = _CELL.match(props.get(P.CELL) or param.rstrip("]"))
            parsed = m.groupdict() if m else {}
            ck, arch, mode = (ck or parsed.get("checkpoint", NONE), arch or parsed.get("arch", NONE),
                              mode or parsed.get("mode", NONE))
            layout, extra = layout or parsed.get("layout"), extra or parsed.get("layout") is not None
    if extra:
        ck = f"{ck} [{layout}]"
    # interned: a file's 100 cases then share 5 strings, which pickle sends from a worker once, not 100 times
    intern = sys.intern
    return intern(ck), intern(arch), intern(mode), intern(check), intern(props.get(P.SCHEME, ""))


def read_file(path: str, today: datetime.date | None = None) -> FileRead:
    """Read one JUnit file; any problem is reported, never raised, so the other files still merge."""
    out = FileRead(path)
    try:
        data = bounded.read_bytes(path, "junit")
        if not data:
            out.problem = "empty file"
            return out
        xml = JUnitXml.fromfile(io.BytesIO(data))
    except bounded.InputError as e:
        out.problem = f"cannot read: {e.why}"
        return out
    except _PARSE_ERRORS as e:
        out.problem = f"not well-formed XML (truncated?): {e}"
        return out
    except JUnitXmlError:
        out.problem = "not a JUnit file: the root element is neither <testsuites> nor <testsuite>"
        return out
    try:
        _cases(out, xml, today)
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as e:
        out.problem, out.rows, out.properties = f"not a readable JUnit file: {type(e).__name__}: {e}"[:500], [], {}
    return out


def _cases(out: FileRead, xml: Any, today: datetime.date | None) -> None:
    """The file's cases into out.rows, and its suite properties."""
    rows: list[Row] = []  # their `entry` is made last: it holds only the properties not all cases share
    intern = sys.intern  # property names recur in every case: one object each, pickled once, kept once
    for suite in xml:
        # a <property> without a name or value (a hand-edited file) reads as "", never None
        out.properties.update((p.name or "", p.value or "") for p in suite.properties())
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
            if has_result or P.WAIVER_REASON in props:
                outcome, message, log = _outcome(TestCase.fromelem(elem), props, today)
            else:
                outcome, message, log = "passed", "", ""
            try:
                seconds = float(elem.get("time") or 0)
            except ValueError:
                seconds = 0.0
            if not math.isfinite(seconds) or seconds < 0:  # time="nan" would make summary.json invalid JSON
                seconds = 0.0
            rows.append(Row(key, outcome, message, log, seconds, props, axes_of(key, props), stamp, ""))
    if rows:
        shared = rows[0].props.items() & rows[-1].props.items()
        for row in rows:
            shared &= row.props.items()
        # sorted: the output's bytes must not depend on the hash seed; what summary.json does not carry stays
        # with each case, where summary_entry leaves it out
        out.common = dict(sorted(kv for kv in shared if kv[0] not in P.NOT_SUMMARIZED))
        for row in rows if shared else ():
            for k in out.common:
                del row.props[k]
    out.rows = [row._replace(entry=summary_entry(row.key, row.outcome, row.props, row.time, row.message,
                                                 row.log_tail)) for row in rows]


def _testcases(suite: ET.Element) -> Iterator[ET.Element]:
    """A suite's <testcase>s, then those of its nested suites, in junitparser's order (depth first, without
    recursion: a file of thousands of nested suites is just a deep file)."""
    stack = [suite]
    while stack:
        s = stack.pop()
        yield from s.iterfind("testcase")
        stack.extend(reversed(s.findall("testsuite")))


@contextlib.contextmanager
def reading(paths: list[str], today: datetime.date | None, jobs: int) -> Iterator[Iterable[FileRead]]:
    """The files, read in order. With several jobs (and enough files to pay for starting them) worker
    processes are already parsing when this yields, so the caller's own work overlaps theirs."""
    jobs = min(jobs, len(paths) // 16)
    if jobs <= 1:
        yield (read_file(p, today) for p in paths)
        return
    pool = ProcessPoolExecutor(jobs)
    try:
        yield pool.map(read_file, paths, [today] * len(paths), chunksize=max(1, len(paths) // (jobs * 8)))
    finally:
        pool.shutdown(cancel_futures=True)


def find_inputs(args: Iterable[str]) -> tuple[list[str], list[dict[str, str]]]:
    """Expand files and run dirs (searched recursively for *.xml); a dir with none is a bad input."""
    files: list[str] = []
    bad: list[dict[str, str]] = []
    for arg in args:
        p = Path(arg)
        if p.is_dir():
            found = sorted(_walk(p, bad))
            if not found:
                bad.append({"path": bounded.shown(arg), "problem": "run directory holds no *.xml file"})
            files += found
        elif p.exists():
            files.append(str(p))
        else:
            raise ReportError(f"{bounded.shown(arg)}: no such file or directory")
    named = [f for f in files if _utf8(f)]
    bad += [{"path": bounded.shown(f), "problem": "the file name is not UTF-8, so no report could name it: not read"}
            for f in files if not _utf8(f)]
    return list(dict.fromkeys(named)), bad


MAX_DEPTH = 64  # directory levels below a run directory searched for *.xml (a runner writes one or two)


def _walk(root: Path, bad: list[dict[str, str]], ending: str = ".xml") -> Iterator[str]:
    """Every *.xml (or other `ending`) entry under `root` (a directory excepted), iteratively, at most MAX_DEPTH
    levels down (a run directory nested 1,200 levels is a bad input, not a RecursionError); links to directories
    are not followed."""
    stack = [(root, 0)]
    while stack:
        d, depth = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError as e:
            bad.append({"path": bounded.shown(d), "problem": f"cannot list: {e.strerror}"})
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                if depth + 1 > MAX_DEPTH:
                    bad.append({"path": bounded.shown(e.path), "problem": f"nested deeper than {MAX_DEPTH} levels "
                                "below the run directory: not searched"})
                else:
                    stack.append((Path(e.path), depth + 1))
            elif e.name.endswith(ending):  # a FIFO or device too: the bounded reader names it, never opens it
                yield e.path


def files_named(root: Path, name: str) -> list[str]:
    """Every entry called `name` under the run directory `root`, searched as JUnit files are (_walk)."""
    return sorted(f for f in _walk(root, [], name) if Path(f).name == name) if root.is_dir() else []


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
