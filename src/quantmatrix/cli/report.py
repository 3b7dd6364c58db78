"""`quantmatrix report`: merge the runners' JUnit files into summary.json, matrix.md and index.html.

Exit status: 0 nothing is red; 1 something is (the nightly job's verdict): a failing case without a live waiver,
new or still failing, a case that stopped being tested or is still untested, a provisioned arch with no results
(red stays red until fixed or waived); 2 the command or its input was wrong (raised as ReportError, printed by
quantmatrix.cli.main), or an input file could not be read (the outputs are still written from the rest, each bad
file named on stderr; `--allow-bad-inputs` makes that a partial night instead, judged on what was read).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantmatrix.errors import ReportError
from quantmatrix.report.build import build
from quantmatrix.report.links import find_bundles
from quantmatrix.report.read import find_inputs
from quantmatrix.report.write import write


def register(sub: Any) -> None:
    """Add `report` to the top-level parser's subcommands (`sub`, from add_subparsers)."""
    p = sub.add_parser("report", help="merge JUnit files of runners into summary.json, matrix.md and index.html",
                       description="Merge nightly JUnit files into summary.json, matrix.md and index.html, "
                                   "diffed against the previous night.")
    p.add_argument("inputs", nargs="+", metavar="RUN_DIRS_OR_FILES",
                   help="JUnit files, or run directories searched recursively for *.xml")
    p.add_argument("--out", required=True, type=Path, help="directory to write summary.json, matrix.md and "
                   "index.html to")
    p.add_argument("--previous", metavar="SUMMARY", help="last night's summary.json")
    p.add_argument("--history", type=int, default=7, metavar="N", help="nights of history kept (default 7)")
    p.add_argument("--date", help="date of this run, YYYY-MM-DD (default: today)")
    p.add_argument("--night", help="label of this run (default: the date)")
    p.add_argument("--provisioned", metavar="ARCHS", help="the archs that have a runner, comma- or space-separated "
                   "(the nightly passes the repository variable QM_PROVISIONED_ARCHS): a provisioned arch with no "
                   "results is lost coverage, a missing case of any other arch is not (default: every arch counts)")
    p.add_argument("--bundles", action="append", type=Path, metavar="DIR", help="where the runners' repro bundles "
                   "(`quantmatrix repro --failed`) were downloaded; each red case links its own (default: searched "
                   "in the run directories); repeatable")
    p.add_argument("--allow-bad-inputs", action="store_true",
                   help="a JUnit file that cannot be read does not fail the command (a partial night)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel parsers (default: CPUs)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """The report's exit code; any OSError (an unwritable --out, a vanished input) is a ReportError."""
    with _no_gc():  # restored only once _run's report is freed: a collection would scan all of it
        try:
            return _run(args)
        except OSError as e:
            raise ReportError(str(e)) from None


def _run(args: argparse.Namespace) -> int:
    """Build and write the report, then print the one summary line the nightly job's log shows."""
    if args.history < 1:
        raise ReportError(f"--history must be at least 1, got {args.history}")
    try:
        date = datetime.date.fromisoformat(args.date) if args.date else datetime.date.today()
    except ValueError:
        raise ReportError(f"--date: expected YYYY-MM-DD, got {args.date!r}") from None
    files, bad = find_inputs(args.inputs)
    provisioned = frozenset(args.provisioned.replace(",", " ").split()) if args.provisioned is not None else None
    report = build(files, args.previous, night=args.night or date.isoformat(), date=date, history=args.history,
                   jobs=max(1, args.jobs), bad=bad, provisioned=provisioned)
    report.bundles = find_bundles(args.bundles or [Path(i) for i in args.inputs], args.out)
    paths = write(report, args.out, max(1, args.jobs))
    d = report.diff
    untested = len(d["newly_skipped"]) + len(d["newly_missing"])
    print(f"quantmatrix report: {len(report.inputs)} files ({len(report.bad_inputs)} bad), "
          f"{len(report.cases)} cases: {len(d['new_failures'])} new failures, "
          f"{len(d['still_failing'])} still failing, "
          f"{len(d['fixed'])} fixed, {untested} newly untested, {len(d['flaky'])} flaky, "
          f"{len(report.disagreements)} cross-arch disagreements ({report.diverged()} outside the top-k) -> "
          f"{paths['html']}")
    for b in report.bad_inputs:
        print(f"quantmatrix report: bad input {b['path']}: {b['problem']}", file=sys.stderr)
    if report.bad_inputs and not args.allow_bad_inputs:
        print(f"quantmatrix report: {len(report.bad_inputs)} input file(s) could not be read; pass "
              "--allow-bad-inputs to judge a partial night", file=sys.stderr)
        return 2
    return report.exit_code


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
