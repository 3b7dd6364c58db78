"""One Verdict style: a frozen Verdict made only by its ok / fail / skip constructors, every failure headed by its
cell and check, measurements (measure/) that never judge, and the plugin's judge that turns a check's own error
into a headed failure too. Read from the source (AST) where the rule is about how code is written."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from matrixkit import SMALL, case_for, gpu_less_suite, write

from quantmatrix.checks.verdict import FAIL, OK, SKIP, Verdict, heading
from quantmatrix.schema.load import load

SRC = Path(__file__).resolve().parents[1] / "src" / "quantmatrix"


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def _files(under: Path) -> list[Path]:
    return sorted(p for p in under.rglob("*.py"))


def test_no_verdict_is_built_but_through_its_constructors_and_none_is_changed_after():
    """`Verdict(...)` only in checks/verdict.py; where verdicts are made and used (checks/, measure/, the plugin, the
    guard) nobody assigns a `problem`, `reason`, `skip` or `properties` field (the five old ways: construct,
    construct then set .problem, pass one in and mutate it, ... are gone)."""
    built, mutated = [], []
    for path in _files(SRC):
        judged = path.parent.name in ("checks", "measure", "pytest_plugin", "guard")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if path != SRC / "checks" / "verdict.py":
            built += [f"{path.name}:{c.lineno}" for c in _calls(tree)
                      if isinstance(c.func, ast.Name) and c.func.id == "Verdict"]
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            mutated += [f"{path.name}:{node.lineno}" for t in targets if judged
                        and isinstance(t, ast.Attribute) and t.attr in ("problem", "reason", "properties", "skip")]
    assert not built and not mutated, (built, mutated)


def test_measurements_never_say_what_is_wrong():
    """measure/ returns data: no `problem` function, method, field or name there (checks/ judges it)."""
    said = []
    for path in _files(SRC / "measure"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = getattr(node, "name", None) or getattr(node, "id", None) or getattr(node, "attr", None)
            if isinstance(name, str) and "problem" in name:
                said.append(f"{path.name}:{node.lineno} {name}")
    assert not said, said


@pytest.fixture(scope="module")
def small_case(tmp_path_factory):
    return case_for(load(write(tmp_path_factory.mktemp("m"))), "tiny-wo", "cpu_probe")


def test_a_verdict_is_frozen_and_each_constructor_says_one_outcome(small_case):
    case = small_case
    ok, fail, skip = Verdict.ok([("k", 1)]), Verdict.fail(case, "broken", [("k", 2)]), Verdict.skip("why")
    assert (ok.outcome, ok.message, ok.properties) == (OK, "", (("k", 1),))
    assert (fail.outcome, fail.problem, fail.message) == (FAIL, "broken", "tiny-wo@sm121-default cpu_probe: broken")
    assert (skip.outcome, skip.problem, skip.message) == (SKIP, None, "why")
    assert Verdict.of(case, None).outcome == OK and Verdict.of(case, "x").message == f"{heading(case)}: x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        fail.problem = "changed"  # type: ignore[misc]


def test_the_judge_heads_every_failure_and_a_check_s_own_error_alike(pytester, monkeypatch):
    """Through the real plugin: a check's failure, and a matrix that states no expectation the check needs (a
    QuantmatrixError raised inside it), both fail with `<cell> <check>: ...`; a skip keeps its reason."""
    suite = """
from quantmatrix.checks.verdict import Verdict

def broken(case):
    return Verdict.fail(case, "it broke", [("seen", "1")])

def unstated(case):
    case.cell.checkpoint.expectation("no_such_key")

def test_cpu_probe(case, judge):
    judge(broken if case.cell.arch.name == "sm100" else unstated if case.cell.arch.name == "sm120" else
          (lambda c: Verdict.skip("not here")), case)
"""
    gpu_less_suite(pytester, monkeypatch, suite, SMALL)
    result = pytester.runpytest("--matrix", "m.yaml", "-k", "tiny-wo and default", "-rs")
    result.assert_outcomes(failed=2, skipped=1)
    result.stdout.fnmatch_lines(["*tiny-wo@sm100-default cpu_probe: it broke*",
                                 "*tiny-wo@sm120-default cpu_probe: *states no expectation 'no_such_key'*",
                                 "*SKIPPED*not here*"])
