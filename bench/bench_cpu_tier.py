"""Wall time of the default matrix's cpu-tier dispatch + audit run (vLLM import included), in a fresh process.

Goal on the 2-core CPU box: under 60 s. Checkpoints are built first (a separate figure: the factory's bench) so
this measures the checks. Run: `.venv/bin/python bench/bench_cpu_tier.py`.

`--per-scheme` times the whole cpu tier (`-m cpu`) once per scheme marker of the default matrix instead (each
family's share of the tier: NVFP4, FP8, ..., a new scheme picked up from the matrix); `--only MARKER ...` limits it
to those markers, `--arch NAME` to one arch.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(marker: str) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "suites", "-q", "-p", "no:cacheprovider", "-m", marker],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"pytest failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    return wall, proc.stdout


def _cases(counts: str) -> int:
    return sum(int(n) for n in re.findall(r"(\d+) (?:passed|failed|skipped|xfailed)", counts))


def per_scheme(only: list[str], arch: str | None) -> None:
    """One timed `-m "cpu and <marker>"` run per scheme marker (checkpoints warmed by a first untimed run each)."""
    sys.path.insert(0, str(ROOT / "src"))
    from quantmatrix.schema.load import DEFAULT_MATRIX, load

    markers = list(dict.fromkeys(s.marker for s in load(ROOT / DEFAULT_MATRIX).schemes.values()))  # schemes share some
    unknown = sorted(set(only) - set(markers))
    if unknown:
        sys.exit(f"no scheme marker {', '.join(unknown)} in {DEFAULT_MATRIX} (markers: {', '.join(markers)})")
    print(f"| scheme marker | cpu-tier cases | wall (s) | s/case |{' arch ' + arch if arch else ''}")
    print("|---|---:|---:|---:|")
    for marker in (m for m in markers if not only or m in only):
        expr = f"cpu and {marker}" + (f" and {arch}" if arch else "")
        run(f"{expr} and dispatch and default")  # warm this family's checkpoints
        wall, out = run(expr)
        cases = _cases(out.strip().splitlines()[-1])
        print(f"| {marker} | {cases} | {wall:.1f} | {wall / max(cases, 1):.2f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--per-scheme", action="store_true", help="time the cpu tier per scheme marker")
    p.add_argument("--only", nargs="+", default=[], metavar="MARKER", help="with --per-scheme: only these markers")
    p.add_argument("--arch", metavar="NAME", help="with --per-scheme: only this arch's cells")
    args = p.parse_args()
    if args.per_scheme:
        per_scheme(args.only, args.arch)
        return
    run("cpu and dispatch and sm121 and default")  # warm the checkpoint cache and vLLM's own caches
    wall, out = run("cpu and (dispatch or audit)")
    summary = out.strip().splitlines()
    builds = next((line for line in summary if "MoE layer builds" in line), "")
    counts = summary[-1]
    print(f"cpu-tier dispatch + audit, default matrix: {wall:.1f} s wall ({counts})")
    print(builds)
    cases = _cases(counts)
    print(f"{cases} cases; goal < 60 s: {'met' if wall < 60 else 'MISSED'}")


if __name__ == "__main__":
    main()
