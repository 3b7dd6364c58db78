"""`quantmatrix ci buildkite`: print the pipeline fragment that runs quantmatrix in vLLM's Buildkite CI
(docs/ci.md).

    quantmatrix ci buildkite --source URL [--ref COMMIT] [--matrix FILE] [--out FILE]

Exit status: 0 printed (or written); 2 bad input (no ref to pin, an unreadable matrix).
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

from quantmatrix.atomic import write_atomic
from quantmatrix.ci import buildkite
from quantmatrix.cli.root import add_trust, default_matrix, project_root
from quantmatrix.errors import QuantmatrixError
from quantmatrix.schema.load import load


def register(sub: Any) -> None:
    p = sub.add_parser("ci", help="CI integrations: a Buildkite pipeline fragment for vLLM's CI",
                       description=__doc__.split("\n\n")[0])
    what = p.add_subparsers(dest="ci", required=True, metavar="SYSTEM")
    bk = what.add_parser("buildkite", help="print the Buildkite steps (cpu tier, gpu tier per arch, annotation)")
    bk.add_argument("--source", required=True, metavar="URL", help="the git URL the agents clone quantmatrix from")
    bk.add_argument("--ref", metavar="COMMIT", help="the quantmatrix commit the steps check out (default: this "
                    "checkout's HEAD, so vLLM's pipeline never moves with quantmatrix's main)")
    bk.add_argument("--matrix", type=Path, metavar="FILE", help="matrix whose archs get gpu steps "
                    "(default matrices/default.yaml); the steps run it by its path in the checkout")
    bk.add_argument("--out", type=Path, metavar="FILE", help="write the fragment here instead of stdout")
    add_trust(bk)
    bk.set_defaults(run=run_buildkite)


def _head(root: Path) -> str:
    """The checkout's commit: the ref a fragment pins when none is given."""
    try:
        proc = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise QuantmatrixError(f"--ref not given and git cannot name this checkout's commit: {e}") from None
    if proc.returncode != 0:
        raise QuantmatrixError(f"--ref not given and {root} is not a git checkout: {proc.stderr.strip()[:300]}")
    return proc.stdout.strip()


def run_buildkite(args: argparse.Namespace) -> int:
    root = project_root()
    path = (args.matrix or default_matrix()).resolve()
    matrix = load(path, args.trust_matrix)
    try:
        relative = path.relative_to(root).as_posix()
    except ValueError:
        raise QuantmatrixError(f"--matrix {path}: the agents run a matrix of the quantmatrix checkout, and this one "
                               f"lies outside {root}") from None
    source = buildkite.Source(args.source, args.ref or _head(root), relative)
    text = buildkite.dump(buildkite.pipeline(matrix, source))
    if args.out:
        write_atomic(args.out, text)
    else:
        print(text, end="")
    return 0
