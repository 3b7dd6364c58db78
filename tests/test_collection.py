"""Collecting the suites costs what collecting any parametrized test costs: the plugin imports neither torch nor
vLLM until a case runs (bench/bench_collect.py measures the rest)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import sys
import pytest
rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]])
print("IMPORTED", "torch" in sys.modules, "vllm" in sys.modules)
sys.exit(rc)
"""


@pytest.mark.parametrize("args", [[], ["-m", "sm120"], ["-m", "gb10 and weight_only"]])
def test_collecting_the_default_matrix_imports_neither_torch_nor_vllm(args):
    """A fresh process collects suites/ over the default matrix (about 930 cases) with torch and vLLM installed, and
    neither is in sys.modules afterwards."""
    proc = subprocess.run([sys.executable, "-c", PROBE, "suites", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "IMPORTED False False" in proc.stdout, proc.stdout[-500:]
