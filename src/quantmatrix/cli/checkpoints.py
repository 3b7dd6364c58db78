"""`quantmatrix lint`, `quantmatrix checkpoint make|list` and `quantmatrix fetch`: checkpoints as files."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from quantmatrix.checkpoints import fetch, lint, make
from quantmatrix.cli.root import add_trust, default_matrix
from quantmatrix.host.detect import query_nvidia_smi
from quantmatrix.schema.load import DEFAULT_MATRIX, MATRICES, load


def register(sub: Any) -> None:
    p = sub.add_parser("lint", help="check a checkpoint's declared scheme against its tensors",
                       description=lint.__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path, help="checkpoint directory (config.json + *.safetensors)")
    p.add_argument("--block-scales", action="store_true",
                   help="also read every F8_E4M3 block scale and report NaN / zero ones (reads ~1/32 of the weights' "
                        "bytes)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.set_defaults(run=run_lint)

    p = sub.add_parser("checkpoint", help="make or list the matrix's synthetic checkpoints")
    what = p.add_subparsers(dest="action", required=True)
    mk = what.add_parser("make", help="write a synthetic checkpoint of the matrix to a directory")
    mk.add_argument("name", help="checkpoint id from the matrix")
    mk.add_argument("--out", type=Path, required=True, help="directory to create (must not exist or be empty)")
    ls = what.add_parser("list", help="name the matrix's checkpoints")
    for q in (mk, ls):
        q.add_argument("--matrix", type=Path, default=None, help=f"matrix YAML (default: {DEFAULT_MATRIX})")
        add_trust(q)
    p.set_defaults(run=run_checkpoint)

    p = sub.add_parser("fetch", help="download a matrix's hub checkpoints into the local HF cache (needs hub access)",
                       description="Download a matrix's hub checkpoints into the local Hugging Face cache "
                                   "(HF_HUB_CACHE, else HF_HOME/hub), where test runs resolve them offline.")
    p.add_argument("--matrix", metavar="FILE", help=f"matrix YAML (default: {MATRICES / 'real.yaml'})")
    add_trust(p)
    p.add_argument("--only", nargs="+", action="extend", default=[], metavar="ID", help="only these checkpoint ids")
    p.add_argument("--dry-run", action="store_true", help="say what is cached and print the download line of each "
                   "checkpoint that is not; download nothing")
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="this runner's GPU count (default: what nvidia-smi lists; none found: fetch everything); a "
                        "checkpoint that needs more GPUs gets its config files only")
    p.set_defaults(run=run_fetch)


def run_lint(args: argparse.Namespace) -> int:
    """0 clean, 1 findings, 2 cannot lint."""
    report = lint.lint(args.dir, block_scales=args.block_scales)
    if args.json:
        print(json.dumps({"path": str(report.path), "declared": dataclasses.asdict(report.declared),
                          "findings": [dataclasses.asdict(f) | {"layer_expert": f.layer_expert}
                                       for f in report.findings]}, indent=2))
    else:
        print(report.render())
    return 1 if report.findings else 0


def run_checkpoint(args: argparse.Namespace) -> int:
    matrix = load(args.matrix if args.matrix is not None else default_matrix(), args.trust_matrix)
    if args.action == "list":
        print("\n".join(make.listing(matrix)))
    else:
        print(make.make(matrix, args.name, args.out))
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    """0 every selected checkpoint is in the cache; 1 a download failed; 2 the command cannot start."""
    matrix = load(args.matrix or default_matrix("real.yaml"), args.trust_matrix)
    gpus = args.gpus
    if gpus is None:
        devices = query_nvidia_smi()
        gpus = len(devices) if devices else None
    return fetch.fetch(fetch.plan(matrix, args.only, gpus), args.dry_run)
