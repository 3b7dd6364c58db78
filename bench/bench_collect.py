"""Collection cost of a 10,000-case generated matrix vs a plain `pytest.mark.parametrize` of the same count.

Target: the matrix costs at most 1.3x the plain parametrize. Both are collected in fresh pytest processes, side
by side in one run, best of N. Run: `.venv/bin/python bench/bench_collect.py [--repeat 3]`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARCHS = 10
MODES = 10
CHECKPOINTS = 100  # 100 x 10 x 10 = 10,000 cells, one cpu check each


def matrix_yaml() -> str:
    lines = ["version: 1", "archs:"]
    lines += [f'  - {{name: a{i}, capability: "{20 + i}.0", label: arch {i}}}' for i in range(ARCHS)]
    lines += ["modes:"] + [f"  - {{name: m{i}, label: mode {i}}}" for i in range(MODES)]
    lines += ["schemes:", "  - {name: bf16, marker: bf16, label: bf16}",
              "checks:", "  - {name: probe, kind: dispatch, tier: cpu, description: bench}", "checkpoints:"]
    lines += [f"  - {{id: ck{i}, source: {{synthetic: {{}}}}, producer: none, scheme: bf16}}"
              for i in range(CHECKPOINTS)]
    return "\n".join(lines) + "\n"


def collect(cwd: Path, *args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                   cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    n = ARCHS * MODES * CHECKPOINTS
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "m.yaml").write_text(matrix_yaml())
        (root / "test_matrix.py").write_text("def test_probe(cell):\n    pass\n")
        (root / "test_plain.py").write_text(
            f"import pytest\n\n@pytest.mark.parametrize('x', range({n}))\ndef test_plain(x):\n    pass\n")
        (root / "test_empty.py").write_text("def test_nothing():\n    pass\n")
        plain, matrix, startup = [], [], []
        for _ in range(args.repeat):  # interleaved, so drift on a shared machine hits both alike
            startup.append(collect(root, "test_empty.py", "--matrix", "m.yaml"))
            plain.append(collect(root, "test_plain.py", "--matrix", "m.yaml"))
            matrix.append(collect(root, "test_matrix.py", "--matrix", "m.yaml"))
    base = min(startup)
    print(f"{n} cases, best of {args.repeat}: process start-up {base:.2f} s")
    print(f"plain parametrize: {min(plain):.2f} s ({min(plain) - base:.2f} s beyond start-up)")
    print(f"quantmatrix matrix: {min(matrix):.2f} s ({min(matrix) - base:.2f} s beyond start-up)")
    print(f"ratio (whole process): {min(matrix) / min(plain):.2f}x; ratio (collection only): "
          f"{(min(matrix) - base) / (min(plain) - base):.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    main()
