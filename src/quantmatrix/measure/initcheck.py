"""compute-sanitizer's initcheck report, read: every "Uninitialized __global__ memory read" with its kernel, access
size, thread and block, device address and host frames (the first three and every Python frame), the ERROR
SUMMARY, and any `PARAMS {json}` line the program printed into the same stream (the H200 probe's parameter record,
../shared/fixtures).

A measurement, never a verdict: what the reads touched is measure.uninit's. A log that cannot be read whole is a
SanitizerLogError naming the line (cut at its head or tail, a report without its address, fewer reports than the
summary counts), never a crash and never a silently partial answer. One pass over the lines, so a report of
100,000 lines reads in a fraction of a second (tests/test_initcheck.py times it).

The format (compute-sanitizer 2025, CUDA 13), each line prefixed with `=========`:

    Uninitialized __global__ memory read of size 4 bytes
        at void at::native::reduce_kernel<...>(T3)+0xd3b0
        by thread (0,49,0) in block (0,0,0)
        Address 0x7f93a5c00588
        Saved host backtrace up to driver entry point at kernel launch time
            Host Frame: cudaLaunchKernel [0x745b7] in libcudart.so.13
    (an empty prefixed line ends the report)
    ERROR SUMMARY: 352 errors
    ERROR SUMMARY: 349 errors were not printed. Use --print-limit option to adjust ...
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quantmatrix import bounded
from quantmatrix.errors import SanitizerLogError

PREFIX = "========="
PARAMS = "PARAMS "
_HEADER = re.compile(r"(?P<what>\S.*?) of size (?P<size>\d+) bytes?")
_SOURCE = re.compile(r"\S+:\d+")
_HEX = re.compile(r"[0-9a-fA-F]+")
_BY = re.compile(r"by thread \((\d+),(\d+),(\d+)\) in block \((\d+),(\d+),(\d+)\)")
_ADDRESS = re.compile(r"Address (0x[0-9a-fA-F]+)")
_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?(?P<unprinted> were not printed)?")
_FRAME = ("Host Frame:", "Device Frame:")
NATIVE_FRAMES = 3
_KNOWN = ("COMPUTE-SANITIZER", "Saved host backtrace")


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    """One reported read: `line` is where it starts in the log (1-based)."""

    line: int
    what: str
    size: int
    kernel: str
    thread: tuple[int, int, int]
    block: tuple[int, int, int]
    address: int
    frames: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class SanitizerLog:
    """A whole log: its reports in the order the sanitizer saw them, the summary's counts, the PARAMS records the
    program printed, and the prefixed lines the reader does not know (kept with their line numbers)."""

    source: str
    reports: tuple[Report, ...]
    errors: int
    not_printed: int
    params: tuple[dict[str, Any], ...]
    unknown: tuple[tuple[int, str], ...]


class _Open:
    """The report being read."""

    __slots__ = ("line", "what", "size", "kernel", "thread", "block", "address", "frames")

    def __init__(self, line: int, what: str, size: int) -> None:
        self.line, self.what, self.size = line, what, size
        self.kernel: str | None = None
        self.thread: tuple[int, int, int] | None = None
        self.block: tuple[int, int, int] | None = None
        self.address: int | None = None
        self.frames: list[str] = []

    def frame(self, text: str) -> None:
        """Keep the first NATIVE_FRAMES frames and every Python one (`name in file.py:line`): what names the
        launch, at a bounded cost per report (a full backtrace is some 30 frames)."""
        if len(self.frames) < NATIVE_FRAMES or ".py:" in text:
            self.frames.append(text)

    def close(self, source: str) -> Report:
        missing = [n for n in ("kernel", "thread", "address") if getattr(self, n) is None]
        if missing:
            raise SanitizerLogError(f"{source}:{self.line}: the report has no {' / '.join(missing)} line (the log "
                                    "is cut, or the sanitizer's format changed)")
        assert self.kernel is not None and self.thread is not None and self.address is not None
        return Report(self.line, self.what, self.size, sys.intern(self.kernel), self.thread, self.block or (0, 0, 0),
                      self.address, tuple(self.frames))


def parse(text: str, source: str = "<log>") -> SanitizerLog:
    """The log read whole; SanitizerLogError where it cannot be (`source` names it in the message)."""
    return parse_lines(text.splitlines(), source)


def read(path: Path) -> SanitizerLog:
    """A log file, streamed line by line (a healthy model's report runs to hundreds of MB): a regular file under
    bounded's cap, or an error naming it."""
    try:
        bounded.check_file(path, "sanitizer_log")
        with path.open(encoding="utf-8", errors="replace") as f:
            return parse_lines(f, str(path))
    except bounded.InputError as e:
        raise SanitizerLogError(f"{path}: cannot read the sanitizer's log ({e.why})") from None
    except OSError as e:
        raise SanitizerLogError(f"{path}: cannot read the sanitizer's log ({e.strerror or e})") from None


def parse_lines(lines: Iterable[str], source: str) -> SanitizerLog:
    """See `parse`; `lines` may keep their line endings."""
    reports: list[Report] = []
    params: list[dict[str, Any]] = []
    unknown: list[tuple[int, str]] = []
    errors, not_printed, summaries = 0, 0, 0
    current: _Open | None = None
    for n, raw in enumerate(lines, 1):
        raw = raw.rstrip("\r\n")
        if not raw.startswith(PREFIX):
            if raw.startswith(PARAMS):
                params.append(_params(raw, source, n))
            continue
        body = raw[len(PREFIX):].strip()
        if body.startswith(_FRAME):
            if current is None:
                raise SanitizerLogError(f"{source}:{n}: a backtrace frame outside any report: the log starts in "
                                        "the middle of one (cut at its head?)")
            current.frame(body.split(":", 1)[1].strip())
        elif not body:
            if current is not None:
                reports.append(current.close(source))
                current = None
        elif current is not None and _field(current, body):
            continue
        elif body.endswith(("bytes", "byte")) and (m := _HEADER.fullmatch(body)):
            if current is not None:
                reports.append(current.close(source))
            current = _Open(n, m["what"], int(m["size"]))
        elif m := _SUMMARY.match(body):
            if current is not None:
                reports.append(current.close(source))
                current = None
            if m["unprinted"]:
                not_printed += int(m[1])
            else:
                errors += int(m[1])
                summaries += 1
        elif not body.startswith(_KNOWN):
            unknown.append((n, body[:300]))
    return _finish(source, current, reports, errors, not_printed, summaries, params, unknown)


def _field(report: _Open, body: str) -> bool:
    """Read one of a report's own lines into it; False when `body` is none of them. Plain string tests first: this
    runs for every line of a report."""
    if report.kernel is None and body.startswith("at "):
        report.kernel = _kernel(body[3:])
    elif report.thread is None and body.startswith("by thread") and (m := _BY.fullmatch(body)):
        g = tuple(int(x) for x in m.groups())
        report.thread, report.block = g[:3], g[3:]  # type: ignore[assignment]
    elif report.address is None and body.startswith("Address ") and (m := _ADDRESS.fullmatch(body)):
        report.address = int(m[1], 16)
    elif not body.startswith("Saved host backtrace"):
        return False
    return True


def _kernel(at: str) -> str:
    """`name+0xOFFSET`, optionally followed by ` in file:line`: the name."""
    name, sep, where = at.rpartition(" in ")
    if sep and _SOURCE.fullmatch(where):
        at = name
    name, sep, offset = at.rpartition("+0x")
    return name if sep and _HEX.fullmatch(offset) else at


def _params(line: str, source: str, n: int) -> dict[str, Any]:
    try:
        value = json.loads(line[len(PARAMS):])
    except (ValueError, RecursionError) as e:
        raise SanitizerLogError(f"{source}:{n}: the PARAMS line is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise SanitizerLogError(f"{source}:{n}: the PARAMS line is not a JSON object of name -> "
                                "[start, end, element size, shape]")
    return value


def _finish(source: str, current: _Open | None, reports: list[Report], errors: int, not_printed: int,
            summaries: int, params: list[dict[str, Any]], unknown: list[tuple[int, str]]) -> SanitizerLog:
    if current is not None:
        raise SanitizerLogError(f"{source}:{current.line}: the log ends inside this report and holds no ERROR "
                                "SUMMARY: the sanitizer did not finish (killed, timed out) or the log is cut")
    if summaries == 0:
        raise SanitizerLogError(f"{source}: no ERROR SUMMARY line ({len(reports)} reports read): the sanitizer did "
                                "not finish (killed, timed out, the target never started) or the log is cut")
    if len(reports) + not_printed != errors:
        lines = "; ".join(f"line {n}: {text!r}" for n, text in unknown[:5])
        raise SanitizerLogError(
            f"{source}: the ERROR SUMMARY counts {errors} errors ({not_printed} not printed), but the log holds "
            f"{len(reports)} reports: " + (f"lines this reader does not know: {lines}" if unknown else
                                           "reports are missing (the log is cut?)"))
    return SanitizerLog(source, tuple(reports), errors, not_printed, tuple(params), tuple(unknown))


_NAMESPACE = re.compile(r"\b(?:[A-Za-z_]\w*::)+")
_CAST = re.compile(r"\((?:int|unsigned int|unsigned long|long|bool|char)\)")


def short_kernel(kernel: str, limit: int = 160) -> str:
    """A kernel's demangled name for a message: no return type, namespaces, integer casts or parameter list."""
    name = kernel.removeprefix("void ")
    if name.endswith(")") and (cut := _params_start(name)) > 0:
        name = name[:cut]
    name = _CAST.sub("", _NAMESPACE.sub("", name))
    return name if len(name) <= limit else name[:limit - 1] + "…"


def _params_start(name: str) -> int:
    """Index of the '(' that opens the trailing parameter list (matching parentheses from the end)."""
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        ch = name[i]
        depth += ch == ")"
        depth -= ch == "("
        if depth == 0:
            return i
    return -1
