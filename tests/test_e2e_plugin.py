"""The e2e plugin as a user runs it (pytester, no engine: the modes make the child crash, quit or hang before
vLLM is imported): one start per group shared by its checks, every failure a failed case with its cause and
log, the other groups going on, gpu-tier cells skipped with the reason, xdist grouping, and the closing note."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from quantmatrix.engine.protocol import FAULT_ENV

MATRIX = f"""\
version: 1
archs:
  - {{name: sm121, capability: "12.1", aliases: [gb10], label: GB10}}
modes:
  - {{name: default, env: {{{FAULT_ENV}: exit}}, label: quits}}
  - {{name: crash, env: {{{FAULT_ENV}: segfault}}, label: segfaults}}
  - {{name: hang, env: {{{FAULT_ENV}: hang}}, label: hangs}}
schemes:
  - name: bf16
    marker: bf16
    label: bf16
    expect:
      degeneration: {{max_repeat_run: 20, min_distinct_1: 0.2, min_distinct_2: 0.3, max_compression_ratio: 6}}
      degenerate: false
      reference: transformers
      agreement_top_k: 2
      invariance_top_k: 0
checks:
  - {{name: degeneration, kind: e2e, tier: gpu, cpu_cells: [{{arch: sm121}}], description: d}}
  - {{name: agreement, kind: e2e, tier: gpu, cpu_cells: [{{mode: [default, crash]}}], description: a}}
checkpoints:
  - {{id: tiny, source: {{path: ck}}, producer: none, scheme: bf16}}
e2e:
  prompts: prompts.txt
  references: refs
  max_tokens: 4
  logprobs: 2
  timeout_s: 6
  reference_mode: default
  platforms: {{cpu: {{engine_args: {{enforce_eager: true}}}}}}
"""

TESTS = """\
from quantmatrix.checks import e2e as verdicts

def test_degeneration(case, engine_run, judge):
    judge(verdicts.degeneration, case, engine_run)

def test_agreement(case, engine_run, reference, judge):
    judge(verdicts.agreement, case, engine_run, reference)
"""


SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(pytester.path / "cache"))
    # the inner pytest runs elsewhere: a relative PYTHONPATH (PYTHONPATH=src) must not lose this checkout
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SRC), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]))
    pytester.makefile(".yaml", m=MATRIX)
    pytester.makefile(".txt", prompts="one prompt\n")
    (pytester.path / "ck").mkdir()
    (pytester.path / "ck" / "config.json").write_text("{}")
    pytester.makepyfile(test_e2e=TESTS)
    return pytester


def test_each_group_starts_once_and_every_failure_is_a_failed_case(project):
    """3 groups, 5 cases: 3 starts; each case fails with its group's cause and the log's last lines; the hang
    is killed and the others still run; the gpu-tier agreement cell of `hang` is skipped with the reason."""
    result = project.runpytest_subprocess("--matrix", "m.yaml", "-rs")
    result.assert_outcomes(failed=5, skipped=1)
    result.stdout.fnmatch_lines([
        "*tiny@sm121-default degeneration: the engine run failed: the child exited with status 3 without a result*",
        "*giving up on purpose*",
        "*tiny@sm121-crash degeneration: the engine run failed: the child died: SIGSEGV (segfault)*",
        "*tiny@sm121-hang degeneration: the engine run failed: timeout: no result after 6 s*",
        "*3 engine starts for 5 e2e cases*",
        "*SKIPPED*needs sm121 (GB10); this host*",
    ])


def _workers(result: pytest.RunResult) -> dict[str, set[str]]:
    """cell -> the xdist workers that reported its cases (from `-v` lines like `[gw1] FAILED test_x[cell]`)."""
    workers: dict[str, set[str]] = {}
    for line in result.stdout.lines:
        hit = re.match(r"\[(gw\d+)\] .*FAILED \S+\[(\S+)\]", line)
        if hit:
            workers.setdefault(hit[2], set()).add(hit[1])
    return workers


def test_under_xdist_a_group_stays_on_one_worker_and_starts_once(project):
    """-n 2 --dist loadgroup: still one start per group, and both checks of a group report the same worker."""
    result = project.runpytest_subprocess("--matrix", "m.yaml", "-n", "2", "--dist", "loadgroup",
                                          "-k", "not hang", "-v")
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines(["*2 engine starts for 4 e2e cases*"])
    workers = _workers(result)
    assert set(workers) == {"tiny@sm121-default", "tiny@sm121-crash"}
    assert all(len(w) == 1 for w in workers.values()), workers


def test_more_groups_than_workers_each_group_on_one_worker_with_one_start(project):
    """7 groups (7 modes whose child quits at once), 2 checks each, under -n 3 --dist loadgroup: every group's
    cases ran on one worker, the groups spread over the workers, and each group started exactly one engine.
    The xdist group of a cell holds no '@' (loadgroup reads the text after the last '@' of a node id)."""
    modes = "".join(f"  - {{name: m{i}, env: {{{FAULT_ENV}: exit}}, label: quits}}\n" for i in range(7))
    text = MATRIX.replace(MATRIX[MATRIX.index("modes:\n"):MATRIX.index("schemes:")], f"modes:\n{modes}")
    text = text.replace("reference_mode: default", "reference_mode: m0").replace(
        "cpu_cells: [{mode: [default, crash]}]", "cpu_cells: [{arch: sm121}]")
    project.makefile(".yaml", m=text)
    result = project.runpytest_subprocess("--matrix", "m.yaml", "-n", "3", "--dist", "loadgroup", "-v")
    result.assert_outcomes(failed=14)
    result.stdout.fnmatch_lines(["*7 engine starts for 14 e2e cases*"])
    workers = _workers(result)
    assert set(workers) == {f"tiny@sm121-m{i}" for i in range(7)}
    assert all(len(w) == 1 for w in workers.values()), workers
    assert len(set().union(*workers.values())) > 1  # the groups were spread, not all put on one worker
