"""Mutation testing of the verdict modules with mutmut: every verdict must be able to fail, so a small change to
its code must turn some test red. Not part of `.ci/run` (minutes per module); run it weekly or before changing a
verdict, and read the survivors it prints.

Each module runs in its own throw-away copy of the checkout (mutmut writes a mutants/ tree beside the code), with
only the tests that exercise it. A mutant counts as killed when a test failed or timed out; "no tests" and
"survived" count against the module; mutants listed in bench/mutation_equivalent.txt (name and why the change
cannot be observed) leave the count. The target is a kill ratio of at least 90% per module.

Run: `.venv/bin/python bench/mutation.py [--only dispatch kernel ...]` (exit 1 when a module misses the target).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTMUT = Path(sys.executable).with_name("mutmut")
TARGET = 0.90
# module -> the tests that exercise its verdicts (small, fast selections: each mutant reruns them)
MODULES: dict[str, list[str]] = {
    "src/quantmatrix/checks/dispatch.py": ["tests/test_verdict_branches.py", "tests/test_dispatch_branches.py"],
    "src/quantmatrix/checks/kernel.py": ["tests/test_verdict_branches.py", "tests/test_dispatch_branches.py"],
    "src/quantmatrix/checks/quality.py": ["tests/test_oracle_branches.py", "tests/test_verdict_branches.py"],
    "src/quantmatrix/checks/e2e.py": ["tests/test_verdicts.py"],
    "src/quantmatrix/checks/audit.py": ["tests/test_audit_branches.py"],
    "src/quantmatrix/checks/ranks.py": ["tests/test_rank_verdicts.py"],
    "src/quantmatrix/measure/split.py": ["tests/test_split.py"],
    "src/quantmatrix/measure/findings.py": ["tests/test_audit_branches.py"],
    "src/quantmatrix/measure/loaded.py": ["tests/test_audit_branches.py"],
    "src/quantmatrix/checks/expected.py": ["tests/test_audit_branches.py", "tests/test_lint_branches.py"],
    "src/quantmatrix/adapter/roles.py": ["tests/test_audit_branches.py"],
    "src/quantmatrix/checkpoints/producers/__init__.py": [
        "tests/test_audit_branches.py", "tests/test_lint_branches.py",
        *(f"tests/test_factory_plugins.py::{t}" for t in (
            "test_every_registered_producer_keeps_the_protocol", "test_a_leaf_in_two_roles_is_refused",
            "test_the_one_name_table_tells_every_leaf_s_role_and_which_leaves_are_quantized"))],
    "src/quantmatrix/checkpoints/lint.py": ["tests/test_lint_branches.py"],
    "src/quantmatrix/report/diff.py": ["tests/test_diff_branches.py"],
    "src/quantmatrix/report/crossarch.py": ["tests/test_crossarch_branches.py"],
    "src/quantmatrix/checks/checkpoint.py": [
        "tests/test_checkpoint_verdicts.py", "tests/test_lint_branches.py",
        *(f"tests/test_factory.py::{t}" for t in (
            "test_bf16_checkpoint_records_the_hf_reference",
            "test_hf_reference_fails_when_the_files_do_not_hold_the_in_memory_model"))],
    "src/quantmatrix/measure/dequant.py": [
        "tests/test_checkpoint_verdicts.py",
        "tests/test_factory.py::test_logit_bound_rejects_a_layout_bug_the_packer_makes_both_ways"],
    "src/quantmatrix/checks/sanitize.py": ["tests/test_sanitize_check.py"],
    "src/quantmatrix/measure/initcheck.py": ["tests/test_initcheck.py"],
    "src/quantmatrix/measure/uninit.py": ["tests/test_initcheck.py", "tests/test_sanitize_check.py"],
    "src/quantmatrix/measure/hf.py": [
        *(f"tests/test_factory.py::{t}" for t in (
            "test_bf16_checkpoint_records_the_hf_reference",
            "test_hf_reference_fails_when_the_files_do_not_hold_the_in_memory_model"))],
}
COPY = ("src", "tests", "suites", "matrices", "references", "conftest.py", "pyproject.toml")
KILLED = {"killed", "timeout"}


def _equivalent() -> dict[str, str]:
    path = ROOT / "bench" / "mutation_equivalent.txt"
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, why = line.partition(" ")
            out[name] = why.strip()
    return out


def _workdir(module: str, tests: list[str]) -> Path:
    work = Path(tempfile.mkdtemp(prefix="quantmatrix-mutation-"))
    for name in COPY:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, work / name)
    (work / "setup.cfg").write_text(
        "[mutmut]\nsource_paths=src\n"
        # forked straight from a process that ran torch, a worker can deadlock on a lock another thread held
        # (measured: workers asleep on a futex for minutes, never reaching their CPU-time limit)
        "process_isolation=forkserver\n"
        f"only_mutate={module}\n"
        "also_copy=\n    matrices\n    references\n    suites\n    conftest.py\n"
        "pytest_add_cli_args_test_selection=\n" + "".join(f"    {t}\n" for t in tests) +
        "pytest_add_cli_args=\n    -p\n    no:cacheprovider\n    -q\n")  # one argument per line: mutmut splits lines
    return work


def _where(work: Path, module: str, name: str) -> str:
    """file:line of a mutant and its change: the line its diff removes, found in the original module, and the
    line it adds instead."""
    diff = subprocess.run([str(MUTMUT), "show", name], cwd=work, capture_output=True, text=True).stdout
    lines = diff.splitlines()
    removed = next((ln[1:].strip() for ln in lines if ln.startswith("-") and not ln.startswith("---")), "")
    added = next((ln[1:].strip() for ln in lines if ln.startswith("+") and not ln.startswith("+++")), "")
    source = (ROOT / module).read_text().splitlines()
    line = next((i for i, text in enumerate(source, 1) if removed and text.strip() == removed), 0)
    return f"{module}:{line}  {removed[:100]}\n      -> {added[:100]}"


def run(module: str, tests: list[str], equivalent: dict[str, str]) -> tuple[int, int, list[str], float]:
    work = _workdir(module, tests)
    start = time.monotonic()
    try:
        subprocess.run([str(MUTMUT), "run"], cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        results = subprocess.run([str(MUTMUT), "results", "--all", "true"], cwd=work, capture_output=True,
                                 text=True).stdout
        status = dict(re.findall(r"^\s*(\S+): (.+)$", results, flags=re.M))
        if not status:
            raise SystemExit(f"mutmut produced no results for {module}: run it by hand in {work}")
        counted = {n: s for n, s in status.items() if n not in equivalent}
        killed = sum(1 for s in counted.values() if s in KILLED)
        survivors = [f"{_where(work, module, n)}  [{s}: {n}]" for n, s in counted.items() if s not in KILLED]
        return killed, len(counted), survivors, time.monotonic() - start
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", help="module stems to run (e.g. dispatch kernel)")
    args = p.parse_args()
    equivalent = _equivalent()
    chosen = {m: t for m, t in MODULES.items() if not args.only or Path(m).stem in args.only}
    below = []
    for module, tests in chosen.items():
        killed, total, survivors, seconds = run(module, tests, equivalent)
        ratio = killed / total if total else 1.0
        print(f"{module}: {killed}/{total} killed = {ratio:.1%} (target {TARGET:.0%}) in {seconds:.0f} s")
        for s in survivors:
            print(f"  survived {s}")
        if ratio < TARGET:
            below.append(module)
    if below:
        print(f"below the target: {', '.join(below)}")
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
