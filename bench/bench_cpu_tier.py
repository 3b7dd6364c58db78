"""Wall time of the default matrix's cpu-tier dispatch + audit run (vLLM import included), in a fresh process.

Goal on the 2-core CPU box: under 60 s. Checkpoints are built first (a separate figure: the factory's bench) so
this measures the checks. Run: `.venv/bin/python bench/bench_cpu_tier.py`.
"""

from __future__ import annotations

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


def main() -> None:
    run("cpu and dispatch and sm121 and default")  # warm the checkpoint cache and vLLM's own caches
    wall, out = run("cpu and (dispatch or audit)")
    summary = out.strip().splitlines()
    builds = next((line for line in summary if "MoE layer builds" in line), "")
    counts = summary[-1]
    print(f"cpu-tier dispatch + audit, default matrix: {wall:.1f} s wall ({counts})")
    print(builds)
    cases = sum(int(n) for n in re.findall(r"(\d+) (?:passed|failed|skipped)", counts))
    print(f"{cases} cases; goal < 60 s: {'met' if wall < 60 else 'MISSED'}")


if __name__ == "__main__":
    main()
