"""`quantmatrix initcheck`: a saved compute-sanitizer initcheck report with its parameter record, judged as the
sanitize mode's uninit_reads check judges it. Exit 1 when a tensor of the model was read where nobody wrote, 0 when
none was, 2 when the input cannot be read whole (a log cut short, reports the sanitizer withheld, no record, a
record that is not one)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from quantmatrix.bounded import shown
from quantmatrix.checks import sanitize
from quantmatrix.cli.root import add_trust, default_matrix
from quantmatrix.errors import QuantmatrixError
from quantmatrix.measure import sanitized
from quantmatrix.schema.load import DEFAULT_MATRIX, load
from quantmatrix.schema.sanitizer import Sanitizer


def register(sub: Any) -> None:
    p = sub.add_parser("initcheck", help="name the model's tensors a compute-sanitizer initcheck report read where "
                                         "nobody wrote", description=__doc__.split("\n\n")[0])
    p.add_argument("path", type=Path, help="a sanitized run's directory (<cache>/e2e/<session>/<cell>-<digest>/, "
                                           "as a failed case names it), or one initcheck log")
    p.add_argument("--params", type=Path, metavar="FILE",
                   help="a log's parameter record: the run's result.json, one worker's record, or a PARAMS object "
                        "(default: the log's own `PARAMS {json}` lines)")
    p.add_argument("--mode", metavar="NAME", help="apply this matrix mode's `sanitizer.silence` entries")
    p.add_argument("--matrix", metavar="FILE", help=f"the matrix of --mode (default: {DEFAULT_MATRIX})")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    add_trust(p)
    p.set_defaults(run=run_initcheck)


def _knob(args: argparse.Namespace) -> Sanitizer | None:
    if args.mode is None:
        if args.matrix:
            raise QuantmatrixError("--matrix names the matrix of --mode: pass --mode NAME too")
        return None
    matrix = load(args.matrix or default_matrix(), args.trust_matrix)
    mode = next((m for m in matrix.modes if m.name == args.mode), None)
    if mode is None or mode.sanitizer is None:
        sanitized_modes = [m.name for m in matrix.modes if m.sanitizer is not None]
        raise QuantmatrixError(f"--mode {args.mode}: {matrix.path} has no mode of that name with a `sanitizer:` knob "
                               f"(sanitized modes: {', '.join(sanitized_modes) or 'none'})")
    return mode.sanitizer


def _measure(args: argparse.Namespace) -> sanitized.Sanitized:
    path: Path = args.path
    if path.is_dir():
        if args.params is not None:
            raise QuantmatrixError(f"--params goes with one log; {path} is a run directory, whose result.json is "
                                   "its record")
        return sanitized.run_directory(path)
    if not path.is_file():
        raise QuantmatrixError(f"{path}: no such file or directory")
    return sanitized.one_log(path, args.params)


def run_initcheck(args: argparse.Namespace) -> int:
    knob = _knob(args)
    measured = _measure(args)
    if measured.unreadable:
        raise QuantmatrixError("the report cannot be read whole, so no verdict:\n" + "\n".join(measured.unreadable))
    judged = sanitize.judge(measured, knob)
    if args.json:
        props = dict(sanitize.properties(measured, judged))
        print(json.dumps({key: json.loads(value) if value[:1] in "[{" else value for key, value in props.items()},
                         indent=2))
        return 1 if judged.failing else 2 if measured.withheld else 0
    order = "split at the marker" if measured.ordered else "unknown (no marker read: every record applies throughout)"
    lines = [f"{args.path}: {measured.reports} reports, {measured.recorded} tensors recorded; order: {order}"]
    if args.path.is_dir() and measured.attribution != sanitized.BY_PID:  # a run's logs matched to its workers
        lines.append(f"logs: {measured.attribution}")
    if judged.failing:
        lines.append(f"FAIL {sanitize.headline(judged.failing)}")
        lines += [f"- {sanitize.describe(f)}" for f in judged.failing]
    else:
        lines.append("OK no tensor of the model was read where nobody wrote")
    lines += [f"silenced ({entry.reason}; {entry.link}): {hit.tensor.name} x{hit.reads} by {hit.kernel}"
              for hit, entry in judged.silenced]
    lines.append(f"other uninitialised reads (scratch/activation memory, not failed): "
                 f"{sanitize.other_line(measured.other)}")
    print("\n".join(shown(line) for line in lines))  # names from the log: one printable line each
    if measured.withheld:
        print(sanitize.withheld_line(measured), file=sys.stderr)
    return 1 if judged.failing else 2 if measured.withheld else 0
