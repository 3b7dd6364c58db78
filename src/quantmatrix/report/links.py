"""What the report links a red cell to and offers for it: its repro bundle (made on the runner by `quantmatrix
repro --failed`, downloaded beside the report), the one command that reruns the cell locally with the night's exact
vLLM wheel, and the bisect command for a cell that turned red between two nights."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from pathlib import Path

from quantmatrix import properties as P
from quantmatrix.adapter.versions import install_command, install_spec
from quantmatrix.report.keys import node_id

BUNDLE_CASE = "case.json"  # every bundle folder holds it; its "key" names the case
_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]+")


def bundle_name(key: str) -> str:
    """The folder of a case's bundle: readable (check, cell) and unique (a digest of the key)."""
    func, _, param = key.rpartition("::")[2].partition("[")
    readable = _UNSAFE.sub("_", f"{func.removeprefix('test_')}-{param.rstrip(']')}")[:100]
    return f"{readable}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def find_bundles(root: Path, relative_to: Path) -> dict[str, str]:
    """{case key: the bundle folder, relative to `relative_to`} of every bundle under `root`; a folder whose
    case.json cannot be read is no bundle."""
    out: dict[str, str] = {}
    for f in sorted(root.rglob(BUNDLE_CASE)) if root.is_dir() else ():
        try:
            key = json.loads(f.read_text(encoding="utf-8"))["key"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(key, str):
            folder = f.parent.resolve()
            try:
                out[key] = folder.relative_to(relative_to.resolve()).as_posix()
            except ValueError:
                out[key] = folder.as_posix()
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
            f"{venv}/bin/{shlex.join(run)} -- {shlex.quote(node_id(key))}")


def bisect_command(key: str, summary: str = "summary.json") -> str:
    """The bisect a new failure's range offers (docs/bisect.md)."""
    return f"quantmatrix bisect {shlex.quote(node_id(key))} --from-report {shlex.quote(summary)}"
