"""Exactly one case, run by pytest in a child process inside a candidate's venv, its verdict read from JUnit.

Only a case that ran and passed or failed is a verdict. An error, a skip, a case that was not collected, or one
failed by the vLLM health gate (the vLLM under test did not import) says nothing about the check: the release is
skipped, as `git bisect skip` would.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from quantmatrix import properties as P
from quantmatrix.errors import BisectError
from quantmatrix.report import read
from quantmatrix.report.keys import node_id, report_key

GOOD, BAD, SKIP = "good", "bad", "skip"
_MESSAGE_CHARS = 600


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one candidate gave: the bisect verdict, pytest's outcome and its message."""

    verdict: str  # good | bad | skip
    outcome: str  # passed | failed | error | skipped | not run | install failed | vllm broken | timeout
    message: str = ""
    recorded: tuple[tuple[str, str], ...] = ()  # what the case measured (its own JUnit properties)

    def describe(self) -> str:
        said = self.message or "; ".join(f"{k}={v}" for k, v in self.recorded)
        return f"{self.outcome}: {said}" if said else self.outcome


def require_case(root: Path, case_id: str, timeout_s: float = 300.0) -> None:
    """The case exists in `root`'s suites (collected here, which imports no vLLM): a typo is a usage error before
    anything is installed, not a "not run" in every venv."""
    nodeid = node_id(case_id)
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", nodeid]
    try:
        r = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise BisectError(f"collecting {nodeid} in {root} took over {timeout_s:.0f} s") from None
    if r.returncode != 0 or nodeid not in r.stdout:
        tail = " | ".join((r.stdout + r.stderr).strip().splitlines()[-3:])
        raise BisectError(f"{nodeid}: not a case in {root} (pytest --collect-only: {tail}); "
                          "`quantmatrix list` names the cells")


def run_case(python: Path, root: Path, case_id: str, timeout_s: float, log: Path,
             pytest_args: tuple[str, ...] = ()) -> Outcome:
    """Run the case with the venv's python from `root` (the suites' checkout) and read its JUnit record."""
    nodeid = node_id(case_id)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTEST_ADDOPTS")}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    with tempfile.TemporaryDirectory(prefix="quantmatrix-bisect-") as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [str(python), "-m", "pytest", nodeid, f"--junitxml={junit}", "-p", "no:cacheprovider", "-q",
               "-o", "junit_family=xunit1", *pytest_args]
        with log.open("a", encoding="utf-8") as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            try:
                subprocess.run(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                               check=False)
            except subprocess.TimeoutExpired:
                return Outcome(SKIP, "timeout", f"the case ran past {timeout_s:.0f} s")
        return read_junit(junit, nodeid)


def read_junit(junit: Path, nodeid: str) -> Outcome:
    """The verdict of `nodeid`'s testcase, read as the nightly report reads JUnit (report.read): a failure is
    bad, a pass is good, anything else (an error in setup or teardown, a skip, a waiver) says nothing."""
    f = read.read_file(str(junit))
    if f.problem:
        return Outcome(SKIP, "not run", f"pytest wrote no readable JUnit ({f.problem}); see the log")
    key = report_key(nodeid)
    rows = [r for r in f.rows if r.key == key]
    if not rows:
        errors = [r.message for r in f.rows if r.outcome == "error"]
        why = f": {errors[0][:_MESSAGE_CHARS]}" if errors else ""
        return Outcome(SKIP, "not run", f"{nodeid} was not collected{why}")
    props = {**f.common, **{k: v for r in rows for k, v in r.props.items()}}
    recorded = tuple((k, v) for k, v in props.items() if k not in f.properties and k not in P.CELL_PROPERTIES)
    text = "\n".join(r.message for r in rows if r.message)[:_MESSAGE_CHARS]
    outcomes = {r.outcome for r in rows}  # a call failure and a teardown error are two records of one case
    if props.get(P.NOT_TESTED) == P.VLLM_BROKEN and outcomes != {"passed"}:
        return Outcome(SKIP, "vllm broken", text)
    if outcomes <= {"passed", "xpassed"} and not text:  # a waived case that passed ran and passed
        return Outcome(GOOD, "passed", "", recorded)
    if outcomes <= {"passed", "failed"}:
        return Outcome(BAD, "failed", text, recorded)
    said = next(o for o in ("error", "skipped", "waived", "xpassed") if o in outcomes)
    return Outcome(SKIP, said, text)
