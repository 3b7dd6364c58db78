"""`quantmatrix list`, `detect` and `run`: the matrix's cells, this host, and the suites into reports/<run-id>/."""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from quantmatrix.adapter import health
from quantmatrix.adapter.versions import versions, vllm_origin
from quantmatrix.cli.root import add_trust, default_matrix, project_root
from quantmatrix.host import sanitizer
from quantmatrix.host.detect import detect
from quantmatrix.pytest_plugin import runner
from quantmatrix.pytest_plugin.options import GPUS_PER_WORKER, HEALTH_TIMEOUT, RUN_ID_ENV, TRUST_MATRIX
from quantmatrix.schema.load import DEFAULT_MATRIX, load
from quantmatrix.schema.model import Matrix


def register(sub: Any) -> None:
    for name, help_text in (("list", "the matrix's cells as a table"),
                            ("detect", "this host's GPUs and the markers they satisfy"),
                            ("run", "pytest over suites/ with JUnit into reports/<run-id>/; unknown arguments go "
                                    "to pytest")):
        sp = sub.add_parser(name, help=help_text)
        sp.add_argument("--matrix", metavar="FILE", help=f"matrix YAML (default: {DEFAULT_MATRIX})")
        add_trust(sp)
        if name in ("detect", "run"):
            sp.add_argument("--arch", metavar="NAME", help="treat this host as arch NAME")
        if name == "detect":
            # the plugin's flag, validated by the same Flag after parsing (a bad value: exit 2 naming it)
            sp.add_argument(HEALTH_TIMEOUT.name, metavar=HEALTH_TIMEOUT.metavar, help=HEALTH_TIMEOUT.help)
        if name == "run":
            sp.add_argument("--run-id", help="report directory name (default: timestamp-host)")
            sp.add_argument("--out", metavar="DIR", help="report directory (default: reports/<run-id>)")
            sp.add_argument("--spread", metavar="N", help="one pytest-xdist worker per N GPUs this process sees "
                            "(CUDA_VISIBLE_DEVICES honoured), each pinned to its own; nothing with fewer than 2N")
        sp.set_defaults(run={"list": cmd_list, "detect": cmd_detect, "run": cmd_run}[name], passthrough=name == "run")


def _matrix(args: argparse.Namespace) -> Matrix:
    return load(args.matrix or default_matrix(), args.trust_matrix)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def cmd_list(args: argparse.Namespace) -> int:
    m = _matrix(args)
    rows = [["CELL", "SCHEME", "PRODUCER", "ARCH", "MODE", "LAYOUT", "CHECKS"]]
    for cell in m.cells():
        checks = [f"{c.name}({c.tier})" for c in m.checks.values() if c.applies_to(cell)]
        rows.append([cell.id, cell.checkpoint.scheme.name, cell.checkpoint.producer,
                     f"{cell.arch.name} ({cell.arch.label})", cell.mode.name, cell.layout.name, ", ".join(checks)])
    print(_table(rows))
    cases = sum(len(m.cases(c)) for c in m.checks.values())
    print(f"\n{len(rows) - 1} cells, {cases} cases from {m.path}")
    return 0


def cmd_detect(args: argparse.Namespace) -> int:
    """This host, and whether the vLLM under test imports here (the same check a session runs first): exit 1
    when it is broken, or missing on a host with a GPU (a GPU runner without vLLM tests nothing that matters), so
    a runner owner can check a new install before the nightly does."""
    timeout = HEALTH_TIMEOUT.value(getattr(args, HEALTH_TIMEOUT.dest))
    m = _matrix(args)
    host = detect(m, args.arch)
    print(f"host: {host.describe(m)}")
    print(f"detected via: {host.source}")
    archs = host.archs(m)
    markers = [n for a in archs for n in (a.name, *a.aliases)]
    print(f"gpu-tier markers this host satisfies: {' '.join(markers) if markers else 'none'}")
    for key, value in versions().items():
        print(f"{key}: {value}")
    sanitized = [md.name for md in m.modes if md.sanitizer is not None]
    if sanitized:
        exe = sanitizer.find()
        print(f"compute-sanitizer: {exe}" if exe else f"compute-sanitizer: none ({sanitizer.missing()}); mode(s) "
              f"{', '.join(sanitized)} will be skipped")
    if vllm_origin() is None:
        if not host.devices:
            print("vllm_health: no vLLM installed (vLLM-needing cases will be skipped on this host without a GPU)")
            return 0
        verdict = health.absent()
        print("\n".join(verdict.detail()))
        print("a GPU host without vLLM: with --strict-hardware (the nightly) every case that needs vLLM fails; "
              "install it (bash setup.sh) or check QM_RUNNER_PYTHON")
        return 1
    verdict = health.check(timeout)
    print("\n".join(verdict.detail()))
    return 0 if verdict.ok else 1


def cmd_run(args: argparse.Namespace, pytest_args: list[str]) -> int:
    """pytest in a child process: a crash in a suite never takes the CLI (or its report path) down with it."""
    root = project_root()
    run_id = args.run_id or f"{datetime.datetime.now():%Y%m%d-%H%M%S}-{socket.gethostname().split('.')[0]}"
    out = Path(args.out) if args.out else root / "reports" / run_id
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pytest", str(root / "suites"), f"--rootdir={root}",
            f"--junitxml={out / 'junit.xml'}", "-o", "junit_family=xunit1"]
    if args.matrix:
        argv.append(f"--matrix={Path(args.matrix).resolve()}")
    if args.trust_matrix:
        argv.append(TRUST_MATRIX.name)
    if args.arch:
        argv.append(f"--arch={args.arch}")
    if args.spread is not None:
        argv += runner.spread(GPUS_PER_WORKER.value(args.spread))
    print(f"quantmatrix run {run_id}: JUnit -> {out / 'junit.xml'}", flush=True)
    env = {**os.environ, RUN_ID_ENV: run_id}
    return subprocess.run(argv + pytest_args, cwd=root, env=env).returncode
