"""`quantmatrix`: list the matrix, detect this host, run the suites into reports/<run-id>/."""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import subprocess
import sys
from pathlib import Path

from quantmatrix import hardware, vllm_adapter
from quantmatrix.errors import QuantmatrixError
from quantmatrix.matrix import Matrix, load


def project_root() -> Path:
    """The checkout holding suites/ and matrices/: from the working directory up, else this package's own."""
    for start in (Path.cwd(), Path(__file__).resolve()):
        for d in (start, *start.parents):
            if (d / "suites").is_dir() and (d / "matrices" / "default.yaml").is_file():
                return d
    raise QuantmatrixError("cannot find the quantmatrix checkout (a directory with suites/ and "
                           "matrices/default.yaml); run from inside it")


def _matrix(args: argparse.Namespace) -> Matrix:
    return load(args.matrix or project_root() / "matrices" / "default.yaml")


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def cmd_list(args: argparse.Namespace) -> int:
    m = _matrix(args)
    rows = [["CELL", "SCHEME", "PRODUCER", "ARCH", "MODE", "CHECKS"]]
    for cell in m.cells():
        checks = [f"{c.name}({c.tier})" for c in m.checks.values() if c.applies_to(cell)]
        rows.append([cell.id, cell.checkpoint.scheme.name, cell.checkpoint.producer,
                     f"{cell.arch.name} ({cell.arch.label})", cell.mode.name, ", ".join(checks)])
    print(_table(rows))
    cases = sum(len(m.cases(c)) for c in m.checks.values())
    print(f"\n{len(rows) - 1} cells, {cases} cases from {m.path}")
    return 0


def cmd_detect(args: argparse.Namespace) -> int:
    m = _matrix(args)
    host = hardware.detect(m, args.arch)
    print(f"host: {host.describe(m)}")
    print(f"detected via: {host.source}")
    archs = host.archs(m)
    markers = [n for a in archs for n in (a.name, *a.aliases)]
    print(f"gpu-tier markers this host satisfies: {' '.join(markers) if markers else 'none'}")
    for key, value in vllm_adapter.versions().items():
        print(f"{key}: {value}")
    return 0


def cmd_run(args: argparse.Namespace, pytest_args: list[str]) -> int:
    """pytest in a child process: a crash in a suite never takes the CLI (or its report path) down with it."""
    root = project_root()
    run_id = args.run_id or (f"{datetime.datetime.now():%Y%m%d-%H%M%S}-"
                             f"{socket.gethostname().split('.')[0]}")
    out = Path(args.out) if args.out else root / "reports" / run_id
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pytest", str(root / "suites"), f"--rootdir={root}",
            f"--junitxml={out / 'junit.xml'}", "-o", "junit_family=xunit1"]
    if args.matrix:
        argv.append(f"--matrix={Path(args.matrix).resolve()}")
    if args.arch:
        argv.append(f"--arch={args.arch}")
    print(f"quantmatrix run {run_id}: JUnit -> {out / 'junit.xml'}", flush=True)
    env = {**os.environ, "QUANTMATRIX_RUN_ID": run_id}
    return subprocess.run(argv + pytest_args, cwd=root, env=env).returncode


# Subcommands whose module owns its own arguments: `quantmatrix NAME ...` is `module.main([...])`.
_DELEGATED = {
    "lint": ("quantmatrix.checkpoints.lint", "check a checkpoint's declared scheme against its tensors"),
    "checkpoint": ("quantmatrix.checkpoints.commands", "make or list the matrix's synthetic checkpoints"),
    "report": ("quantmatrix.report", "merge JUnit files of runners into summary.json, matrix.md and index.html"),
    "fetch": ("quantmatrix.fetch", "download a matrix's hub checkpoints into the local HF cache (needs hub access)"),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quantmatrix", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in _DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    for name, help_text in (("list", "the matrix's cells as a table"),
                            ("detect", "this host's GPUs and the markers they satisfy"),
                            ("run", "pytest over suites/ with JUnit into reports/<run-id>/; "
                                    "unknown arguments go to pytest")):
        sp = sub.add_parser(name, help=help_text)
        sp.add_argument("--matrix", metavar="FILE", help="matrix YAML (default: matrices/default.yaml)")
        if name in ("detect", "run"):
            sp.add_argument("--arch", metavar="NAME", help="treat this host as arch NAME")
        if name == "run":
            sp.add_argument("--run-id", help="report directory name (default: timestamp-host)")
            sp.add_argument("--out", metavar="DIR", help="report directory (default: reports/<run-id>)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in _DELEGATED:
            import importlib

            return int(importlib.import_module(_DELEGATED[argv[0]][0]).main(argv[1:]))
        args, rest = parser().parse_known_args(argv)
        if rest and args.command != "run":
            parser().error(f"unrecognized arguments: {' '.join(rest)}")
        if args.command == "run":
            return cmd_run(args, rest)
        return {"list": cmd_list, "detect": cmd_detect}[args.command](args)
    except QuantmatrixError as e:
        print(f"quantmatrix: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `quantmatrix list | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
