"""What the report links a red cell to and offers for it: its repro bundle (made on the runner by `quantmatrix
repro --failed`, downloaded beside the report), the one command that reruns the cell locally with the night's exact
vLLM wheel, and the bisect command for a cell that turned red between two nights."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from pathlib import Path

from quantmatrix import bounded
from quantmatrix import properties as P
from quantmatrix.adapter.versions import install_command, install_spec
from quantmatrix.report import read
from quantmatrix.report.keys import node_id
from quantmatrix.report.model import RED, CaseResult, NightReport

BUNDLE_CASE = "case.json"  # every bundle folder holds it; its "key" names the case
_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]+")
# a relative link target that can carry no markup and no scheme (javascript:): what a bundle link may be
SAFE_LINK = re.compile(r"(?:\.\./)*[A-Za-z0-9._@-]+(?:/[A-Za-z0-9._@-]+)*")


def bundle_name(key: str) -> str:
    """The folder of a case's bundle: readable (check, cell) and unique (a digest of the key)."""
    func, _, param = key.rpartition("::")[2].partition("[")
    readable = _UNSAFE.sub("_", f"{func.removeprefix('test_')}-{param.rstrip(']')}")[:100]
    return f"{readable}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def find_bundles(roots: list[Path], relative_to: Path) -> dict[str, str]:
    """{case key: its bundle folder as a link from `relative_to`} for every bundle under the `roots` (a runner's
    `quantmatrix repro --failed` output, downloaded with its JUnit); a folder whose case.json cannot be read, or
    whose path could not be a plain relative link, is no bundle."""
    out: dict[str, str] = {}
    for root in roots:
        for f in map(Path, read.files_named(root, BUNDLE_CASE)):
            try:
                key = json.loads(bounded.read_text(f, "bundle"))["key"]
            except (OSError, ValueError, KeyError, TypeError, bounded.InputError):
                continue
            link = Path(os.path.relpath(f.parent.resolve(), relative_to.resolve())).as_posix()
            if isinstance(key, str) and SAFE_LINK.fullmatch(link):
                out[key] = link
    return out


def rerun_command(key: str, props: dict[str, str]) -> str:
    """One shell line, run in a quantmatrix checkout, that reruns exactly this case with exactly the night's vLLM
    (its recorded wheel or spec) in a fresh venv."""
    dist = props.get(P.VLLM_DISTRIBUTION, "")
    spec = install_spec(props.get(P.VLLM_VERSION, "?"), dist, props.get(P.VLLM_WHEEL, ""))
    venv = ".venv-rerun"
    run = ["quantmatrix", "run", "--arch", props.get(P.ARCH, "?")]
    matrix = Path(props.get(P.MATRIX, ""))
    if matrix.name:  # the runner's path of it; in a checkout it is matrices/<name>
        run += ["--matrix", f"matrices/{matrix.name}" if matrix.parent.name == "matrices" else str(matrix)]
    return (f"{install_command(spec, dist, venv)} && uv pip install --python {venv}/bin/python -e '.[dev]' && "
            f"{venv}/bin/{shlex.join(run)} {shlex.quote(node_id(key))}")


def bisect_command(key: str, summary: str = "summary.json") -> str:
    """The bisect a new failure's range offers (docs/bisect.md)."""
    return f"quantmatrix bisect {shlex.quote(node_id(key))} --from-report {shlex.quote(summary)}"


def offers(report: NightReport, case: CaseResult, summary: str = "summary.json") -> dict[str, str]:
    """What a red case offers a maintainer: its bundle (when one was found), the rerun command, and for a new
    failure with a night to compare against, the bisect command."""
    if case.outcome not in RED:
        return {}
    out = {"rerun": rerun_command(case.key, report.run_props(case))}
    if case.key in report.bundles:
        out["bundle"] = report.bundles[case.key]
    if case.key in report.diff["bisect"]:
        out["bisect"] = bisect_command(case.key, summary)
    return out
