"""What the vLLM health check costs, and how fast a stale "healthy" verdict turns into one shared cause.

`seed PYTHON`: the seed cell (`test_config_dispatch[qwen3moe-tiny-nvfp4-weight-only@sm121-default]`) in the venv of
PYTHON (the pre-fix vLLM 0.28.0, where it is red), timed from a cold `pytest` start: once with an empty health
cache (the first session under that install checks vLLM, in the process that then runs the case: vLLM imported
once), once with --vllm-health-child (the check in a child first, as before: vLLM imported twice) and once with the
verdict the first session kept (every later session). Goal: red within 30 s.

`stale`: this interpreter's vLLM. A cpu-tier session records vLLM as healthy; then vLLM's quantization package
raises at import (the cuda-bindings failure the check exists for, injected by a sitecustomize on PYTHONPATH) and
the healthy verdict is planted under the broken environment's key, as a change the key cannot see (a native
library replaced in place) would leave it. The cpu tier then runs from that stale "ok". Goal: one shared cause
within 90 s. Run: `.venv/bin/python bench/bench_health.py seed /tmp/v/bin/python` or `... stale`.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEED = "suites/test_dispatch.py::test_config_dispatch[qwen3moe-tiny-nvfp4-weight-only@sm121-default]"
SHARED = "vLLM under test broken, not tested: "
CHILD = "--vllm-health-child"
BREAK = '''import sys


class _CudaBindings:
    """vLLM's quantization package trips over the CUDA bindings at import."""

    def find_spec(self, name, path=None, target=None):
        if name == "vllm.model_executor.layers.quantization":
            raise AttributeError("module 'cuda.bindings.runtime' has no attribute 'cudaLibrary_t'")
        return None


sys.meta_path.insert(0, _CudaBindings())
'''


CPU = {"s": 0.0}  # CPU seconds of the last pytest run and its children: what the load of a shared machine spares


def pytest(python: str, args: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU["s"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return time.perf_counter() - start, proc


def counts(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else f"no output (rc {proc.returncode})"


def env_with(cache: Path, pythonpath: list[str]) -> dict[str, str]:
    return {**os.environ, "QUANTMATRIX_CACHE": str(cache),
            "PYTHONPATH": os.pathsep.join([*pythonpath, str(ROOT / "src")])}


def load() -> str:
    """The machine's load when a number was taken (2 cores, shared: a number means little without it)."""
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def seed(python: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = env_with(Path(tmp), [])
        pytest(python, [SEED], env)  # builds the seed checkpoint (the verdict is dropped below: the check is timed)
        runs = (("empty health cache", [SEED]), ("empty health cache, --vllm-health-child", [SEED, CHILD]),
                ("verdict kept by the previous session", [SEED]))
        for what, args in runs:
            if what.startswith("empty"):
                shutil.rmtree(Path(tmp) / "health", ignore_errors=True)
            wall, proc = pytest(python, args, env)
            red = proc.returncode == 1 and "1 failed" in counts(proc)
            print(f"seed cell, {what}: {wall:.1f} s, {'red' if red else 'NOT red'} ({counts(proc)}); "
                  f"goal < 30 s: {'met' if red and wall < 30 else 'MISSED'}; {CPU['s']:.1f} CPU s; {load()}")


def stale() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cache, site = Path(tmp) / "cache", Path(tmp) / "site"
        site.mkdir()
        healthy, broken = env_with(cache, []), env_with(cache, [str(site)])
        wall, proc = pytest(sys.executable, ["suites", "-m", "cpu and dispatch and sm121"], healthy)
        print(f"healthy session: {wall:.1f} s ({counts(proc)})")
        (ok,) = (cache / "health").glob("*.json")
        (site / "sitecustomize.py").write_text(BREAK)
        key = subprocess.run([sys.executable, "-c", "from quantmatrix.pytest_plugin.health import _cache_path; "
                              "print(_cache_path())"], env=broken, capture_output=True, text=True, check=True)
        shutil.copy(ok, key.stdout.strip())  # the stale "ok", as a change the key cannot see leaves it
        junit = Path(tmp) / "stale.xml"
        wall, proc = pytest(sys.executable, ["suites", "-m", "cpu", f"--junitxml={junit}"], broken)
        red = [(tc.get("name"), bad.get("message", "")) for tc in ET.parse(junit).iter("testcase")
               for bad in (tc.find("failure"), tc.find("error")) if bad is not None]
        own = [name for name, message in red if SHARED not in message]
        shared = len(red) - len(own)
        print(f"cpu tier from a stale ok: {wall:.1f} s, {CPU['s']:.1f} CPU s ({counts(proc)}); {shared} red with "
              f"the shared cause, {len(own)} with their own error ({', '.join(map(str, own[:3]))})")
        print(f"goal: one shared cause within 90 s: {'met' if shared and len(own) <= 1 and wall < 90 else 'MISSED'}; "
              f"{load()}")

if __name__ == "__main__":
    if sys.argv[1:2] == ["seed"] and len(sys.argv) == 3:
        seed(sys.argv[2])
    elif sys.argv[1:] == ["stale"]:
        stale()
    else:
        sys.exit(__doc__)
