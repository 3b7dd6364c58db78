"""Fifteen scripted nights of the nightly, each through the real plugin's JUnit (one pytest run per arch runner,
`--arch X -m X` over one small two-arch matrix, as nightly-arch.yml runs it) and the real `quantmatrix report`
(with the previous night's summary.json, as nightly-report.yml runs it), asserting each night's exit code and
headline: a failure, a skip that stays untested, a runner offline past the history window, a same-day return, a
cancelled night, a broken wheel, a cross-arch divergence, a waiver that acknowledges a lost case and then
expires, and a matrix change that drops it. The engine is tests/standin_vllm.py's stand-in (vLLM's CPU engine
costs ~25 s a start here); what breaks or diverges is the arch's `fake_kernel`, the wheel the stand-in package
installed `broken`.

Each night's assertions fail on the code this issue started from (issue 28's closing note lists how): a skip or a
missing case turned green after a night or after the history window, a second report of one night exited 2, a
cancelled night had no report, and no night printed a headline.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import pytest
from standin_vllm import install

from quantmatrix.cli import main

SRC = Path(__file__).resolve().parent.parent / "src"
TODAY = datetime.date.today()
EXPIRES = TODAY + datetime.timedelta(days=12)  # the waiver of nights 12-14: live on night 12, expired from 13

MATRIX = """\
version: 1
archs:
  - {name: sm120, capability: "12.0", aliases: [rtx_pro_6000], label: RTX PRO 6000,
     engine_args: {fake_kernel: reference}}
  - {name: sm121, capability: "12.1", aliases: [gb10], label: GB10, engine_args: {fake_kernel: KERNEL}}
modes:
  - {name: default, label: default}
schemes:
  - name: bf16
    marker: bf16
    label: bf16
    expect:
      degeneration: {max_repeat_run: 4, min_distinct_1: 0.5, min_distinct_2: 0.5, max_compression_ratio: 6}
      degenerate: false
      agreement_top_k: 3
checks:
  - {name: degeneration, kind: e2e, tier: gpu, vllm: [engine], description: greedy output is not degenerate}
checkpoints:
  - {id: tiny-a, source: {path: ck}, producer: none, scheme: bf16}
  - {id: tiny-b, source: {path: ck}, producer: none, scheme: bf16}
e2e:
  prompts: prompts.txt
  references: refs
  max_tokens: 6
  logprobs: 5
  timeout_s: 120
  reference_mode: default
"""
WAIVER = f"""
waivers:
  - match: {{checkpoint: tiny-b, arch: sm121}}
    reason: GB10 runner short of disk for tiny-b
    link: https://github.com/example/qm/issues/28
    expires: {EXPIRES}
"""
DROPPED = """
exclude:
  - {checkpoint: tiny-b, arch: sm121}
"""
TESTS = """\
from quantmatrix.checks import e2e as verdicts

def test_degeneration(case, engine_run, judge):
    judge(verdicts.degeneration, case, engine_run)
"""


class Nightly:
    """The runners and the report workflow of one repository, night after night."""

    def __init__(self, pytester: pytest.Pytester, tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.pytester, self.tmp, self.capsys = pytester, tmp, capsys
        self.sites = {False: install(tmp / "site-ok"), True: install(tmp / "site-broken", broken=True)}
        self.previous: Path | None = None
        self.runs: dict[tuple[Any, ...], Path] = {}

    def runner(self, arch: str, kernel: str = "reference", *args: str, extra: str = "", broken: bool = False) -> Path:
        """One arch job's JUnit file: the real plugin over the matrix (plus `extra` YAML), reused when a later
        night runs the very same job."""
        key = (arch, kernel, args, extra, broken)
        if key not in self.runs:
            os.environ["PYTHONPATH"] = os.pathsep.join([str(self.sites[broken]), str(SRC)])
            os.environ["RUNNER_NAME"] = f"{arch}-1"
            self.pytester.makefile(".yaml", m=MATRIX.replace("KERNEL", kernel) + extra)
            junit = self.pytester.path / f"run{len(self.runs)}-{arch}.xml"
            result = self.pytester.runpytest_subprocess("--matrix", "m.yaml", "--arch", arch, "-m", arch, *args,
                                                       "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                                                       f"--junitxml={junit}")
            assert junit.is_file(), result.stdout.str()
            self.runs[key] = junit
        return self.runs[key]

    def report(self, night: int, *files: Path, conclusion: str = "") -> tuple[int, str, dict[str, Any]]:
        """`quantmatrix report` as the report workflow runs it: (exit code, headline, summary.json)."""
        out = self.tmp / f"report-n{night}"
        date = TODAY + datetime.timedelta(days=night)
        argv = ["report", *map(str, files), "--out", str(out), "--night", f"n{night}", "--date", str(date),
                "--history", "2"]
        argv += ["--previous", str(self.previous)] if self.previous else []
        argv += ["--conclusion", conclusion] if conclusion else []
        self.capsys.readouterr()
        code = main(argv)
        said = self.capsys.readouterr().out
        if (out / "summary.json").is_file():
            self.previous = out / "summary.json"
        headline = next((ln.split(": ", 2)[2] for ln in said.splitlines()
                         if ln.startswith(f"quantmatrix report: night n{night}: ")), "")
        return code, headline, json.loads((out / "summary.json").read_text()) if out.exists() else {}


@pytest.fixture
def nightly(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
            capsys: pytest.CaptureFixture[str]) -> Nightly:
    monkeypatch.setenv("PYTHONPATH", str(SRC))  # Nightly.runner sets these two per run; monkeypatch restores them
    monkeypatch.setenv("RUNNER_NAME", "")
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("QUANTMATRIX_ARCH", raising=False)
    pytester.makefile(".txt", prompts="first prompt\nsecond prompt\n")
    (pytester.path / "ck").mkdir()
    (pytester.path / "ck" / "config.json").write_text("{}")
    pytester.makepyfile(test_e2e=TESTS)
    return Nightly(pytester, tmp_path, capsys)


GREEN = "✅ nothing is failing and nothing stopped being tested"
A, B = "test_e2e::test_degeneration[tiny-a@sm121-default]", "test_e2e::test_degeneration[tiny-b@sm121-default]"


def counts(new: int = 0, still: int = 0, newly_untested: int = 0, still_untested: int = 0) -> str:
    return (f"{new} new failures, {still} still failing, {newly_untested} newly untested, {still_untested} still "
            "untested")


def test_fifteen_nights_each_with_its_exit_code_and_headline(nightly: Nightly) -> None:
    """Night by night (history window: 2 nights; every arch counts):

    1 both runners green. 2 sm121 degenerates: two new failures. 3 sm121's run hits its time limit: both cases
    "not run", newly untested. 4 again: still untested, red (a skip never turns green by repetition). 5-7 the
    sm121 runner is offline: its cases missing, red on night 7 too, past the history window, naming when they last
    ran. 8 the later cron reports the night without sm121, which comes back the same day: the night's report is
    replaced, diffed against night 7, green, "report 2 of this night". 9 the night is cancelled after sm120
    reported: red, saying so. 10 sm121's new wheel does not import: one shared cause, red. 11 sm121's kernel
    parts from sm120's tokens outside the top-k: red on cross-arch divergence alone. 12 sm121 stops running tiny-b
    under a live waiver: acknowledged, green. 13 the waiver expired: red again. 14 still red past the window. 15
    the matrix drops tiny-b on sm121: removed, green."""
    n = nightly
    sm120 = n.runner("sm120")
    assert n.report(1, sm120, n.runner("sm121"))[:2] == (0, GREEN)

    code, headline, s = n.report(2, sm120, n.runner("sm121", "degenerate"))
    assert (code, headline, s["diff"]["new_failures"]) == (
        1, f"❌ {counts(new=2)}; 2 cross-arch divergences outside the top-k", [A, B])

    not_run = n.runner("sm121", "reference", "--time-limit", "0.001")
    code, headline, s = n.report(3, sm120, not_run)
    assert (code, headline, s["diff"]["newly_skipped"]) == (1, f"❌ {counts(newly_untested=2)}", [A, B])
    code, headline, s = n.report(4, sm120, not_run)
    assert (code, headline, s["diff"]["still_skipped"]) == (1, f"❌ {counts(still_untested=2)}", [A, B])
    assert s["cases"][A]["tested"] == "n2"

    assert n.report(5, sm120)[:2] == (1, f"❌ no results at all from sm121; {counts(newly_untested=2)}")
    for night in (6, 7):
        code, headline, s = n.report(night, sm120)
        assert (code, headline) == (1, f"❌ no results at all from sm121; {counts(still_untested=2)}")
    assert "tested last on n2, not since" in s["cases"][A]["message"] and s["cases"][A]["history"] == "missing missing"

    code, headline, _ = n.report(8, sm120, conclusion="in_progress")  # the 10:17 cron: sm121 not there yet
    assert (code, headline) == (1, f"❌ no results at all from sm121; {counts(still_untested=2)}")
    code, headline, s = n.report(8, sm120, n.runner("sm121"), conclusion="success")  # sm121 back the same day
    assert (code, headline, s["night"], s["previous_night"], s["updates"]) == (0, GREEN, "n8", "n7", 2)

    code, headline, _ = n.report(9, sm120, conclusion="cancelled")
    assert (code, headline) == (1, "❌ the nightly run was cancelled or replaced by a newer run: this night is "
                                   "incomplete; no results at all from sm121; " + counts(newly_untested=2))

    code, headline, s = n.report(10, sm120, n.runner("sm121", broken=True))
    cuda = "AttributeError: module 'cuda.bindings.runtime' has no attribute 'cudaLibrary_t'"
    quantization = "vllm.model_executor.layers.quantization"
    assert (code, headline) == (1, f"❌ vLLM under test broken on sm121 (sm121-1): config (import {quantization}: "
                                   f"{cuda}); layers (import {quantization} (inside {quantization}.modelopt): {cuda}); "
                                   f"engine (import vllm.entrypoints.llm: {cuda}); {counts(new=2)}")
    assert s["totals"]["not tested (vLLM broken)"] == 2

    code, headline, s = n.report(11, sm120, n.runner("sm121", "outside"))
    assert (code, headline, s["totals"]["failed"]) == (1, "❌ 2 cross-arch divergences outside the top-k", 0)

    without_b = n.runner("sm121", "reference", "-k", "not tiny-b", extra=WAIVER)
    sm120_w = n.runner("sm120", extra=WAIVER)
    code, headline, s = n.report(12, sm120_w, without_b)
    assert (code, headline, s["diff"]["acknowledged"]) == (0, GREEN, [B])
    assert s["cases"][B]["properties"]["waiver_reason"] == "GB10 runner short of disk for tiny-b"
    code, headline, s = n.report(13, sm120_w, without_b)  # the day after the waiver's last day
    assert (code, headline, s["diff"]["still_missing"]) == (1, f"❌ {counts(still_untested=1)}", [B])
    assert n.report(14, sm120_w, without_b)[:2] == (1, f"❌ {counts(still_untested=1)}")

    code, headline, s = n.report(15, n.runner("sm120", extra=DROPPED), n.runner("sm121", extra=DROPPED))
    assert (code, headline, s["diff"]["removed"], B in s["cases"]) == (0, GREEN, [B], False)
