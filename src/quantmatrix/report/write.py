"""Writing the night's three outputs: summary.json, matrix.md and index.html, each atomically."""

from __future__ import annotations

import contextlib
import multiprocessing
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from quantmatrix.atomic import write_atomic
from quantmatrix.bounded import shown
from quantmatrix.errors import ReportError
from quantmatrix.report import render_html, render_md
from quantmatrix.report.build import summary_json
from quantmatrix.report.model import NightReport, grid


def write(report: NightReport, out: Path, jobs: int = 1) -> dict[str, Path]:
    """Write the three outputs, each atomically; with jobs > 1 summary.json and matrix.md are written by a
    second process while this one renders the page."""
    out.mkdir(parents=True, exist_ok=True)
    g = grid(report)
    paths = {"summary": out / "summary.json", "matrix": out / "matrix.md", "html": out / "index.html"}

    def summary_and_matrix() -> None:
        write_atomic(paths["summary"], summary_json(report))
        write_atomic(paths["matrix"], render_md.render(report, g))

    with _aside(jobs > 1, summary_and_matrix, "summary.json and matrix.md"):
        write_atomic(paths["html"], render_html.render(report, g))
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
    child = multiprocessing.get_context("fork").Process(target=_one_line(job, what), name=f"quantmatrix report: {what}")
    child.start()
    try:
        yield
    finally:
        child.join()
    if child.exitcode != 0:
        raise ReportError(f"writing {what} failed in a child process (exit code {child.exitcode}); the reason is "
                          "printed above")


def _one_line(job: Callable[[], None], what: str) -> Callable[[], None]:
    """The forked job, an OSError of its writing (an unusable --out) one line on stderr and exit status 2, as bad
    input is everywhere (multiprocessing would print a raw traceback); a bug still shows its traceback."""
    def run() -> None:
        try:
            job()
        except OSError as e:
            print(f"quantmatrix report: error: writing {what}: {shown(e, 300)}", file=sys.stderr, flush=True)
            sys.exit(2)
    return run
