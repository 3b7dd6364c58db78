"""The cost of the parallel layouts in the cpu tier: the default matrix's layer checks (layer_dispatch,
post_load_audit, kernel_format, rank_shards) under the layouts other than the serving one, in a fresh process, with
the ranks each built in their own process (measure.pool), against the same checks in the one-rank layout.

Reports wall times, the rank processes the plugin built and how many per second (the plugin's own closing line:
ranks built over the time the ranks took, vLLM's one import in the pool child included). Checkpoints are built
first (the factory's bench) so this measures the checks. Run: `.venv/bin/python bench/bench_parallel.py`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYER_CHECKS = "layer_dispatch or post_load_audit or kernel_format or rank_shards"


def run(marker: str) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "suites/test_layers.py", "-q", "-p", "no:cacheprovider",
                           "-m", marker, "-k", LAYER_CHECKS], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"pytest failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    return wall, proc.stdout


def main() -> None:
    run("cpu and sm121 and tp1")  # warm the checkpoint cache and the vLLM health record
    one, out_one = run("cpu and tp1")
    many, out = run("cpu and not tp1")
    ranks = next((line for line in out.splitlines() if "ranks built" in line), "")
    m = re.search(r"(\d+) ranks built .* for (\d+) \(checkpoint, layout\) pairs in ([\d.]+) s", ranks)
    print(f"one-rank layout (tp1), every arch: {one:.1f} s wall ({out_one.strip().splitlines()[-1]})")
    print(f"other layouts (tp2, tp2_ep, tp4, tp8), every arch: {many:.1f} s wall ({out.strip().splitlines()[-1]})")
    if m:
        built, jobs, seconds = int(m[1]), int(m[2]), float(m[3])
        print(f"{built} ranks built in their own processes for {jobs} (checkpoint, layout) pairs in {seconds:.1f} s: "
              f"{built / seconds:.2f} ranks/s, {jobs / seconds:.2f} pairs/s")
    else:
        print(ranks or "no rank processes ran")


if __name__ == "__main__":
    main()
