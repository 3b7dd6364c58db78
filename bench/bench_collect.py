"""Collection cost of the real suites over a big matrix vs plain pytest, side by side, best of N.

Arm `quantmatrix`: `pytest --collect-only -m sm120 suites/ --matrix BIG` in the checkout, where BIG is the default
matrix with its checkpoints repeated (new ids) until it expands to about 8,600 cases of the real checks.
Arm `plain`: pytest without the quantmatrix plugins (`-p no:...`, no conftest) collecting the same cases as
plain `pytest.mark.parametrize`s (one test function per check, the same ids, one arch marker per case, built from
a JSON list), so that `-m sm120` selects and prints as many items as the matrix does.

Each run is a fresh process; CPU time (user + system) and peak RSS are the child's own, read with os.wait4. A
warm-up run of each arm first writes the byte-code caches (PYTHONDONTWRITEBYTECODE is dropped for the children),
as a runner's checkout has them. Measured (2-core VM, pytest 9.1.1, 8,612 cases, 2,153 selected): plain 2.21 s
CPU / 67.2 MiB, quantmatrix 2.43 s / 67.0 MiB: 1.10x CPU, 1.00x memory.

Targets: CPU <= 1.3x and peak memory <= 1.5x of plain. Run: `.venv/bin/python bench/bench_collect.py [--repeat 3]`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TARGET_CASES = 8600


def _write(path: Path, data: dict) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def big_matrix(out: Path) -> tuple[Path, list[tuple[str, str, str]]]:
    """The default matrix with copies of its checkpoints (new ids) added until it expands to TARGET_CASES cases
    or just over; returns it and every case's (check, id, arch) as the plugin parametrizes them."""
    from quantmatrix.schema.load import load

    src = ROOT / "matrices" / "default.yaml"
    data = yaml.safe_load(src.read_text(encoding="utf-8"))
    for key in ("prompts", "references"):
        data["e2e"][key] = str((src.parent / data["e2e"][key]).resolve())
    originals = data["checkpoints"]
    path = out / "big.yaml"
    # A copy does not match the id selectors of the e2e checks: count what one copy of each adds.
    _write(path, {**data, "checkpoints": originals + [dict(c, id=f"{c['id']}-r0") for c in originals]})
    probe = load(path)
    count: dict[str, int] = {}
    for check in probe.checks.values():
        for case in probe.cases(check):
            count[case.cell.checkpoint.id] = count.get(case.cell.checkpoint.id, 0) + 1
    chosen, total, i = list(originals), sum(count.get(c["id"], 0) for c in originals), 0
    while total < TARGET_CASES:
        c = originals[i % len(originals)]
        chosen.append(dict(copy.deepcopy(c), id=f"{c['id']}-r{i // len(originals)}"))
        total += count.get(f"{c['id']}-r0", 0)
        i += 1
    _write(path, {**data, "checkpoints": chosen})
    m = load(path)
    return path, [(check.name, c.cell.id, c.cell.arch.name) for check in m.checks.values() for c in m.cases(check)]


def plain_suite(out: Path, cases: list[tuple[str, str, str]], archs: list[str]) -> Path:
    """The same cases as plain parametrizes built from a JSON list, one test function per check (as suites/ has),
    the way a data-driven suite without a plugin would write them."""
    d = out / "plain"
    d.mkdir()
    (d / "pytest.ini").write_text("[pytest]\nmarkers =\n" + "".join(f"    {a}: arch\n" for a in archs))
    (d / "cases.json").write_text(json.dumps(cases))
    body = ["import json", "from pathlib import Path", "", "import pytest", "",
            "CASES = json.loads((Path(__file__).parent / 'cases.json').read_text())", "", "",
            "def params(check):",
            "    return [pytest.param(i, id=cid, marks=getattr(pytest.mark, arch))",
            "            for i, (name, cid, arch) in enumerate(CASES) if name == check]"]
    for check in dict.fromkeys(c for c, _, _ in cases):
        body += ["", "", f"@pytest.mark.parametrize('x', params({check!r}))", f"def test_{check}(x):", "    pass"]
    (d / "test_plain.py").write_text("\n".join(body) + "\n")
    return d


def measure(cwd: Path, *args: str) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one fresh pytest process."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as on a runner: pycs kept
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"collection failed ({proc.returncode}) in {cwd}: {proc.stderr.read().decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="quantmatrix-bench-") as tmp:
        out = Path(tmp)
        matrix, cases = big_matrix(out)
        archs = sorted({a for _, _, a in cases})
        plain_dir = plain_suite(out, cases, archs)
        selected = sum(1 for _, _, a in cases if a == "sm120")
        arms = {"plain": (plain_dir, ("-p", "no:quantmatrix", "-p", "no:quantmatrix_e2e", "-m", "sm120")),
                "quantmatrix": (ROOT, ("suites", "--matrix", str(matrix), "-m", "sm120"))}
        for cwd, argv in arms.values():  # warm-up: byte-code caches written, files in the page cache
            measure(cwd, *argv)
        runs: dict[str, list[tuple[float, float, float]]] = {k: [] for k in arms}
        for _ in range(args.repeat):  # interleaved, so drift on a shared machine hits both alike
            for name, (cwd, argv) in arms.items():
                runs[name].append(measure(cwd, *argv))
    print(f"{len(cases)} cases ({selected} selected by -m sm120), best of {args.repeat}:")
    best = {k: (min(r[0] for r in v), min(r[1] for r in v), min(r[2] for r in v)) for k, v in runs.items()}
    for k, (wall, cpu, rss) in best.items():
        print(f"  {k:12s} wall {wall:5.2f} s   CPU {cpu:5.2f} s   peak RSS {rss:6.1f} MiB")
    q, b = best["quantmatrix"], best["plain"]
    print(f"ratio: CPU {q[1] / b[1]:.2f}x (target <= 1.3x), peak memory {q[2] / b[2]:.2f}x (target <= 1.5x), "
          f"wall {q[0] / b[0]:.2f}x")


if __name__ == "__main__":
    main()
