"""`quantmatrix repro`: a red cell as a bundle a vLLM developer runs without quantmatrix (docs/repro.md).

    quantmatrix repro CASE_ID (--junit PATH... | --from-report SUMMARY) --out DIR
    quantmatrix repro --failed --junit PATH... [--previous SUMMARY] --out DIR [--limit N]

Exit status: 0 the bundles were written; 1 --failed found failures it could not bundle (each named); 2 bad input
(an unknown case, an unreadable record or matrix, a case that did not fail); 3 an internal error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantmatrix import properties as P
from quantmatrix.atomic import dump_json, write_atomic
from quantmatrix.cli.root import add_trust, default_matrix, project_root
from quantmatrix.errors import QuantmatrixError, ReproError
from quantmatrix.report.links import bundle_name
from quantmatrix.repro import CHECKPOINT_CAP
from quantmatrix.schema.load import load
from quantmatrix.schema.model import Matrix

if TYPE_CHECKING:
    from quantmatrix.repro.record import Record


def register(sub: Any) -> None:
    p = sub.add_parser("repro", help="make a vLLM-only repro bundle of a red cell",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("case", nargs="?", metavar="CASE_ID", help="e.g. 'suites/test_dispatch.py::"
                   "test_config_dispatch[CELL]' (the report's key spelling works too)")
    p.add_argument("--junit", nargs="+", default=[], metavar="PATH", help="the run's JUnit files or run directories")
    p.add_argument("--from-report", type=Path, metavar="SUMMARY", help="a report's summary.json instead of JUnit")
    p.add_argument("--matrix", type=Path, metavar="FILE", help="the matrix the run used (default: the one its "
                   "JUnit names, else matrices/default.yaml)")
    add_trust(p)
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="the bundle folder (--failed: one "
                   "folder per case under DIR, and DIR/index.json)")
    p.add_argument("--failed", action="store_true", help="a bundle for every failed case of the run")
    p.add_argument("--previous", type=Path, metavar="SUMMARY", help="with --failed: only cases that were not "
                   "already red in this summary.json (last night's)")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="with --failed: at most N bundles (50)")
    p.add_argument("--checkpoint-cap", type=float, default=CHECKPOINT_CAP / 2**20, metavar="MB",
                   help="largest checkpoint a bundle carries (default %(default)g MB); above it, its recipe")
    p.add_argument("--no-environment", action="store_true", help="skip `vllm collect-env`")
    p.set_defaults(run=run)


def _records(args: argparse.Namespace) -> list[Record]:
    from quantmatrix.repro import record

    if bool(args.junit) == (args.from_report is not None):
        raise ReproError("give the run's --junit files or a report's --from-report summary.json (one of them)")
    return record.from_junit(args.junit) if args.junit else record.from_summary(args.from_report)


def _matrix(args: argparse.Namespace, rec: Record, cache: dict[Path, Matrix]) -> Matrix:
    """--matrix, else the file the run names (relative to the checkout when it is not here), else the default."""
    path = args.matrix
    if path is None and rec.prop(P.MATRIX):
        named = Path(rec.prop(P.MATRIX))
        path = named if named.is_file() else project_root() / "matrices" / named.name
    path = (path or default_matrix()).resolve()
    if path not in cache:
        cache[path] = load(path, args.trust_matrix)
    return cache[path]


def run(args: argparse.Namespace) -> int:
    # imported here: the bundle writer imports torch (seconds), which no other subcommand should pay for
    from quantmatrix.repro import bundle, record

    records = _records(args)
    options = bundle.Options(int(args.checkpoint_cap * 2**20), not args.no_environment)
    matrices: dict[Path, Matrix] = {}
    if not args.failed:
        if not args.case:
            raise ReproError("name the CASE_ID, or pass --failed for every failed case")
        rec = record.find(records, args.case)
        if not rec.red:
            raise ReproError(f"{rec.key} did not fail in {rec.source} (it {rec.outcome}): nothing to reproduce")
        out = bundle.make(rec, _matrix(args, rec, matrices), args.out, options)
        print(f"quantmatrix repro: {rec.key} -> {out} (run {out / 'repro.py'})")
        return 0
    chosen = record.new_failures(records, args.previous)
    index: dict[str, str] = {}
    failed = 0
    for rec in chosen[: max(0, args.limit)]:
        name = bundle_name(rec.key)
        try:
            bundle.make(rec, _matrix(args, rec, matrices), args.out / name, options)
        except QuantmatrixError as e:
            failed += 1
            print(f"quantmatrix repro: {rec.key}: no bundle: {e}", file=sys.stderr)
            continue
        index[rec.key] = name
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "index.json", dump_json(index))
    left = len(chosen) - min(len(chosen), max(0, args.limit))
    print(f"quantmatrix repro: {len(index)} bundles in {args.out} ({failed} failed"
          + (f", {left} over --limit" if left else "") + ")")
    return 1 if failed else 0
