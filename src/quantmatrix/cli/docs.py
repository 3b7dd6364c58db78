"""`quantmatrix docs`: rewrite the tables of docs/matrix.md that restate the package data (report.doc_tables)."""

from __future__ import annotations

import argparse
from typing import Any

from quantmatrix.cli.root import default_matrix, project_root
from quantmatrix.report import doc_tables
from quantmatrix.schema.load import DEFAULT_MATRIX, load

DOC = "docs/matrix.md"


def register(sub: Any) -> None:
    p = sub.add_parser("docs", help=f"regenerate the data tables of {DOC} (scheme x producer x arch dispatch, the "
                                    "factory's schemes and producers)")
    p.add_argument("--matrix", metavar="FILE", help=f"matrix whose expectations the dispatch table shows "
                                                    f"(default: {DEFAULT_MATRIX})")
    p.add_argument("--check", action="store_true", help=f"write nothing; exit 1 when {DOC} is out of date")
    p.set_defaults(run=run_docs)


def run_docs(args: argparse.Namespace) -> int:
    path = project_root() / DOC
    matrix = load(args.matrix or default_matrix())
    if args.check:
        old = path.read_text(encoding="utf-8")
        stale = doc_tables.render(old, doc_tables.tables(matrix), str(path)) != old
        print(f"{path}: out of date, run `quantmatrix docs`" if stale else f"{path}: up to date")
        return int(stale)
    print(f"{path}: {'rewritten' if doc_tables.update(path, matrix) else 'already up to date'}")
    return 0
