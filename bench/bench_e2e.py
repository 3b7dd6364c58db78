"""Cost of the CPU e2e tier: engine starts vs cases, and the suite's own overhead per group (time outside vLLM's
engine start + generation: child process start, `import vllm`, inspection, result I/O), plus what pytest adds
on top of the engine runs (collection, checkpoints, verdicts).

Runs `pytest suites -m "e2e and cpu"` once in a fresh process and reads the per-case JUnit properties.
Run: `PYTHONPATH=src .venv/bin/python bench/bench_e2e.py [--matrix FILE] [-- extra pytest args]`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from quantmatrix import properties as P

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--matrix", default=str(ROOT / "matrices" / "default.yaml"))
    p.add_argument("pytest_args", nargs="*")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        junit = Path(d) / "e2e.xml"
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "suites"), "-q", "-p", "no:cacheprovider",
                               "-m", "e2e and cpu", f"--matrix={args.matrix}", f"--junitxml={junit}",
                               *args.pytest_args], cwd=ROOT, capture_output=True, text=True)
        total = time.perf_counter() - start
        if not junit.is_file():
            sys.exit(f"pytest wrote no JUnit (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        cases = [{p.get("name"): p.get("value") for p in tc.iter("property")}
                 for tc in ET.parse(junit).iter("testcase")]
    cases = [c for c in cases if P.ENGINE_GROUP in c]
    groups = {c[P.ENGINE_GROUP]: c for c in cases if P.engine_timing("load_s") in c}
    print(f"pytest -m 'e2e and cpu': exit {proc.returncode}, {total:.1f} s wall")
    print(f"{len(groups)} engine starts for {len(cases)} e2e cases")
    print(f"{'group':58} {'wall':>6} {'start':>6} {'gen':>5} {'import':>6} {'other':>6} {'overhead':>8}")
    walls = 0.0
    for name, c in sorted(groups.items()):
        wall, over = float(c[P.ENGINE_WALL_S]), float(c[P.SUITE_OVERHEAD_S])
        load, gen, imp = (float(c[P.engine_timing(t)]) for t in ("load_s", "generate_s", "import_s"))
        walls += wall
        print(f"{name:58} {wall:6.1f} {load:6.1f} {gen:5.1f} {imp:6.1f} {over - imp:6.1f} {over:8.1f}")
    if groups:
        overheads = [float(c[P.SUITE_OVERHEAD_S]) for c in groups.values()]
        print(f"suite overhead per group: mean {sum(overheads) / len(overheads):.1f} s (of which `import vllm` "
              f"is the bulk); pytest outside the engine runs: {total - walls:.1f} s for the whole tier")


if __name__ == "__main__":
    main()
