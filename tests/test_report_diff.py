"""The nightly diff rules, night after night, each night a real pytest run and a real report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from quantmatrix import properties as P
from quantmatrix.cli import main

if TYPE_CHECKING:
    from conftest import SuiteRunner

A = "qwen3moe-tiny-nvfp4-weight-only@sm121-nocache"
B = "qwen3moe-tiny-nvfp4-weight-only@sm120-nocache"
KEY_A = f"test_suite::test_config_dispatch[{A}]"


class Nights:
    """One night at a time: pytest writes the JUnit files, the report reads them and last night's summary."""

    def __init__(self, suite: SuiteRunner, tmp: Path, history: int = 7) -> None:
        self.suite, self.tmp, self.history = suite, tmp, history
        self.previous: Path | None = None
        self.provisioned: str | None = None
        self.n = 0

    def run(self, *runs: dict[str, Any]) -> tuple[int, dict[str, Any], str]:
        """Each run is SuiteRunner.run's keywords (one JUnit file, e.g. one arch's runner)."""
        self.n += 1
        files = []
        for i, kw in enumerate(runs):
            self.suite.run(f"n{self.n}-{i}", **kw)
            files.append(str(self.suite.last))
        out = self.tmp / f"out{self.n}"
        argv = ["report", *files, "--out", str(out), "--night", f"n{self.n}", "--date", f"2026-12-{self.n:02d}",
                "--history", str(self.history)]
        argv += ["--provisioned", self.provisioned] if self.provisioned is not None else []
        code = main(argv + (["--previous", str(self.previous)] if self.previous else []))
        self.previous = out / "summary.json"
        return code, json.loads(self.previous.read_text()), (out / "matrix.md").read_text()


@pytest.fixture
def nights(junit_suite: SuiteRunner, tmp_path: Path) -> Nights:
    return Nights(junit_suite, tmp_path)


def fail(*cells: str) -> dict[str, str]:
    return {f"config_dispatch[{c}]": "fail" for c in cells}


def test_new_failure_fails_the_job_and_names_the_bisect_range(nights: Nights) -> None:
    """Passed last night, fails tonight: a new failure, exit 1, with the last good night and the vLLM
    versions of both nights."""
    code, s, _ = nights.run({"cells": [A, B], "vllm": "0.11.1"})
    assert code == 0 and s["diff"]["new_failures"] == []
    code, s, md = nights.run({"cells": [A, B], "outcomes": fail(A), "vllm": "0.11.2.dev5"})
    assert code == 1
    assert s["diff"]["new_failures"] == [KEY_A]
    assert s["diff"]["bisect"][KEY_A] == {"last_passed_night": "n1", "last_passed_vllm": "0.11.1"}
    assert "last passed **n1** (vLLM 0.11.1) → now vLLM 0.11.2.dev5" in md
    assert "## New failures (1)" in md


def test_red_stays_red_until_fixed(nights: Nights) -> None:
    """A case red two nights in a row fails both nights: new the first (exit 1), `still failing` the second
    (exit 1 again, listed apart from new failures); when it passes again it is `fixed` and the night is green."""
    assert nights.run({"cells": [A], "outcomes": fail(A)})[0] == 1  # first night: every failure is new
    code, s, md = nights.run({"cells": [A], "outcomes": fail(A)})
    assert code == 1 and s["diff"]["still_failing"] == [KEY_A] and s["diff"]["new_failures"] == []
    assert "## Still failing (1)" in md and "0 new failures, 1 still failing" in md
    code, s, md = nights.run({"cells": [A]})
    assert code == 0 and s["diff"]["fixed"] == [KEY_A]


def test_newly_skipped_is_lost_coverage_and_stays_red_while_skipped(nights: Nights) -> None:
    """A case that ran last night and is skipped tonight is a coverage loss (red, exit 1); skipped again the
    night after it is still untested (red again, naming the night it last ran), until it runs."""
    nights.run({"cells": [A]})
    code, s, md = nights.run({"cells": [A], "outcomes": {f"config_dispatch[{A}]": "skip"}})
    assert code == 1 and s["diff"]["newly_skipped"] == [KEY_A]
    assert "## Coverage lost (1)" in md and "🕳️" in md
    code, s, md = nights.run({"cells": [A], "outcomes": {f"config_dispatch[{A}]": "skip"}})
    assert code == 1 and s["diff"]["newly_skipped"] == [] and s["diff"]["still_skipped"] == [KEY_A]
    assert "still skipped, tested last on n1 (coverage lost)" in md and "1 still untested" in md
    assert s["cases"][KEY_A]["tested"] == "n1"
    code, s, _ = nights.run({"cells": [A]})
    assert code == 0 and s["cases"][KEY_A]["tested"] == "n4"


def test_an_arch_that_stops_reporting_is_lost_then_still_lost_then_back(nights: Nights) -> None:
    """When the sm121 runner's file is gone its cases are carried as `missing` (exit 1 the first night and
    every night after: an arch offline two nights stays red), the arch is named, and when it is back its history
    shows the gap."""
    sm120 = {"cells": [B], "runner": "rtx-pro-6000"}
    sm121 = {"cells": [A], "runner": "gb10", "vllm": "0.11.1"}
    assert nights.run(sm120, sm121)[0] == 0
    code, s, md = nights.run(sm120)
    assert code == 1
    assert s["diff"]["newly_missing"] == [KEY_A] and s["diff"]["archs_lost"] == ["sm121"]
    assert s["cases"][KEY_A]["outcome"] == "missing"
    assert s["cases"][KEY_A]["properties"]["runner"] == "gb10"
    assert "no results at all from: sm121" in md
    code, s, md = nights.run(sm120)
    assert code == 1 and s["diff"]["still_missing"] == [KEY_A]
    assert "| 🕳️ 1 missing |" in md
    code, s, _ = nights.run(sm120, sm121)
    assert code == 0 and s["cases"][KEY_A]["outcome"] == "passed"
    assert s["cases"][KEY_A]["history"] == "missing missing passed@0.11.1"


def test_a_missing_case_that_ran_is_red_past_the_history_until_its_matrix_drops_it(junit_suite: SuiteRunner,
                                                                                   tmp_path: Path) -> None:
    """A case that ran once and then sends nothing is carried, red, beyond the history window (here 2 nights),
    naming the night it last ran; when its matrix runs without it (the MATRIX_CASES record no longer defines it)
    it is dropped, listed once as removed, and the night is green."""
    nights = Nights(junit_suite, tmp_path, history=2)
    nights.run({"cells": [A, B]})
    for _ in range(3):
        code, s, _ = nights.run({"cells": [B]})
        assert code == 1 and KEY_A in s["cases"] and s["cases"][KEY_A]["tested"] == "n1"
    assert s["diff"]["still_missing"] == [KEY_A] and "tested last on n1" in s["cases"][KEY_A]["message"]
    record = P.encode_matrix_cases(P.MatrixCases("matrix.yaml", {"config_dispatch": frozenset([B])}, []))
    code, s, md = nights.run({"cells": [B], "suite_props": {P.MATRIX_CASES: record}})
    assert code == 0 and KEY_A not in s["cases"] and s["diff"]["removed"] == [KEY_A]
    assert "## Removed from the matrix (no longer reported) (1)" in md
    assert P.MATRIX_CASES not in str(s["inputs"])  # the record is read, not carried into summary.json


def test_outcome_alternating_over_nights_is_flaky(nights: Nights) -> None:
    """pass, fail, pass over three nights (read from the summary history alone) is flagged flaky."""
    nights.run({"cells": [A]})
    nights.run({"cells": [A], "outcomes": fail(A)})
    code, s, md = nights.run({"cells": [A]})
    assert code == 0
    assert s["diff"]["flaky"] == [KEY_A] and s["diff"]["fixed"] == [KEY_A]
    assert "## Flaky (1)" in md


def test_last_good_night_can_be_older_than_last_night(nights: Nights) -> None:
    """pass (vLLM a), skipped (vLLM b), fail (vLLM c): a new failure whose bisect range starts two nights
    back; the first night's JUnit files are not given to the third report, only last night's summary."""
    nights.run({"cells": [A], "vllm": "0.11.0"})
    nights.run({"cells": [A], "vllm": "0.11.1", "outcomes": {f"config_dispatch[{A}]": "skip"}})
    code, s, md = nights.run({"cells": [A], "vllm": "0.11.2", "outcomes": fail(A)})
    assert code == 1 and s["diff"]["new_failures"] == [KEY_A]
    assert s["diff"]["bisect"][KEY_A] == {"last_passed_night": "n1", "last_passed_vllm": "0.11.0"}
    assert "last passed **n1** (vLLM 0.11.0) → now vLLM 0.11.2" in md


def test_history_is_bounded(junit_suite: SuiteRunner, tmp_path: Path) -> None:
    """--history N keeps N previous nights in summary.json, for the nights and for every case."""
    nights = Nights(junit_suite, tmp_path, history=2)
    for _ in range(4):
        _, s, _ = nights.run({"cells": [A, B]})
    assert [n["night"] for n in s["nights"]] == ["n3", "n2"]
    assert all(len(c["history"].split()) == 2 for c in s["cases"].values())


def test_waived_is_not_a_failure_but_an_expired_waiver_is(nights: Nights) -> None:
    """A waived case shows as waived with reason and link and keeps the job green; once its waiver has
    expired the same case is a failure (a new one, exit 1)."""
    code, s, md = nights.run({"cells": [A, B], "outcomes": {f"config_dispatch[{A}]": "waive"}})
    assert code == 0 and s["cases"][KEY_A]["outcome"] == "waived"
    assert ("FlashInfer MoE NaN on GB10 ([https://github.com/example/qm/issues/7]"
            "(https://github.com/example/qm/issues/7); expires 2099-12-31)") in md
    assert "🟡" in md
    code, s, md = nights.run({"cells": [A, B], "outcomes": {f"config_dispatch[{A}]": "expired"}})
    assert code == 1 and s["diff"]["new_failures"] == [KEY_A]
    assert "**expired**, counted as failed" in md


def test_cross_arch_disagreement_names_the_arch_that_differs(junit_suite: SuiteRunner,
                                                             tmp_path: Path) -> None:
    """Greedy tokens of one checkpoint and mode are compared across archs: the odd one out is named with its
    device and the first diverging token ('GB10 differs from RTX PRO 6000'); other modes are not mixed in."""
    ck1, ck2 = "qwen3moe-tiny-nvfp4-weight-only", "mixtral-tiny-nvfp4-w4a4"
    good, bad = [[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]]
    tokens = {f"e2e_greedy[{ck1}@sm100-default]": good, f"e2e_greedy[{ck1}@sm120-default]": good,
              f"e2e_greedy[{ck1}@sm121-default]": bad, f"e2e_greedy[{ck1}@sm121-eager]": [[7]],
              f"e2e_greedy[{ck2}@sm120-default]": good, f"e2e_greedy[{ck2}@sm121-default]": [[1, 2, 3]]}
    cells = [k.split("[")[1].rstrip("]") for k in tokens]
    night = {"cells": cells, "checks": ("e2e_greedy",), "tokens": tokens}
    code, s, md = Nights(junit_suite, tmp_path).run(night)
    by_ck = {d["checkpoint"]: d for d in s["disagreements"]}
    assert sorted(by_ck) == [ck2, ck1]
    d = by_ck[ck1]
    assert (d["mode"], [r["arch"] for r in d["reference"]]) == ("default", ["sm100", "sm120"])
    assert [(x["arch"], x["device"], x["detail"]) for x in d["differs"]] == [
        ("sm121", "NVIDIA GB10", "prompt 1 diverges at token 1: 9 vs 5 (no top-k recorded)")]
    assert by_ck[ck2]["differs"][0]["detail"] == "1 prompts vs 2"
    assert ("sm121 (NVIDIA GB10) differs from sm100 (NVIDIA B200), sm120 (NVIDIA RTX PRO 6000 Blackwell): "
            "prompt 1 diverges at token 1: 9 vs 5") in md
    assert "sm121 (NVIDIA GB10) differs from sm120 (NVIDIA RTX PRO 6000 Blackwell): 1 prompts vs 2" in md
    assert "≠ archs" in md
    # without a recorded top-k nothing shows a near-tie: every disagreement is red
    assert code == 1 and s["exit_code"] == 1 and all(x["red"] for d in by_ck.values() for x in d["differs"])


def _greedy_night(top_sm121: list[list[list[int]]]) -> dict[str, Any]:
    """sm120 and sm121 part at prompt 0, token 2 (sm120: 30, sm121: 31); sm121's top-3 there is `top_sm121`."""
    ck = "qwen3moe-tiny-nvfp4-weight-only"
    a, b = f"degeneration[{ck}@sm120-default]", f"degeneration[{ck}@sm121-default]"
    ranked_sm120 = [[[10, 11, 12], [20, 21, 22], [30, 31, 32]], [[40, 41, 42]]]
    return {"cells": [a.split("[")[1][:-1], b.split("[")[1][:-1]], "checks": ("degeneration",),
            "tokens": {a: [[10, 20, 30], [40]], b: [[10, 20, 31], [40]]},
            "top_k": {a: {"k": 3, "ranked": ranked_sm120}, b: {"k": 3, "ranked": top_sm121}}}


@pytest.mark.parametrize(("top_sm121", "red", "detail", "marks"), [
    ([[[10, 11, 12], [20, 21, 22], [31, 30, 32]], [[40, 41, 42]]], False,
     "near-tie: prompt 0 diverges at token 2: 31 vs 30 (ranks 2 and 2 in each other's top-3)", ["✅", "✅"]),
    ([[[10, 11, 12], [20, 21, 22], [31, 33, 34]], [[40, 41, 42]]], True,
     "prompt 0 diverges at token 2: 31 vs 30 (ranks 2 and >3 in each other's top-3)", ["✅", "❌"]),
], ids=["near_tie", "outside"])
def test_cross_arch_red_outside_the_top_k_and_a_near_tie_only_shown(junit_suite: SuiteRunner, tmp_path: Path,
                                                                     one_disagreement: Any, top_sm121: list,
                                                                     red: bool, detail: str, marks: list[str]
                                                                     ) -> None:
    """sm120 and sm121 part at prompt 0, token 2. Where each token is in the other's top-k (sm121's 31 is
    sm120's rank 2 and the other way round) it is a near-tie: recorded with both ranks and shown (≈, ≠ archs),
    the night green. Where sm120's 30 is not in sm121's top-3 it is red: summary.json (the entry, exit_code),
    matrix.md (❌ on sm121's cell, the line, the heading) and the exit code, with no case failed."""
    code, s, md = Nights(junit_suite, tmp_path).run(_greedy_night(top_sm121))
    assert one_disagreement(s, md, "sm121", red) == detail
    assert code == int(red) and s["totals"]["failed"] == 0
    assert ("1 cross-arch divergences outside the top-k" in md) is red
    row = next(line for line in md.splitlines() if line.startswith("| qwen3moe-tiny-nvfp4-weight-only"))
    assert [c.strip()[:1] for c in row.split("|")[3:5]] == marks and "≠ archs" in row.split("|")[4]
    key = "test_suite::test_degeneration[qwen3moe-tiny-nvfp4-weight-only@sm121-default]"
    assert P.GREEDY_TOKEN_IDS in s["cases"][key]["properties"]  # summary.json keeps the tokens, not the top-k
    assert P.GREEDY_TOP_K not in s["cases"][key]["properties"] and P.GREEDY_TOP_K not in str(s["inputs"])
    page = (tmp_path / "out1" / "index.html").read_text()  # the page's data: what its script marks red
    data = json.loads(page.split('id="qm-data">', 1)[1].split("</script>", 1)[0])
    flags = dict(zip(sorted(s["cases"]), data["cases"]["f"], strict=True))
    assert (flags[key], data["disagreements"][0]["red"], data["exit"]) == (32 | (64 if red else 0), int(red), int(red))


@pytest.mark.parametrize("edit, message", [
    (lambda s: s | {"schema": 2}, "not a quantmatrix summary of schema 1"),
    (lambda s: s | {"cases": {"k": {"outcome": "exploded", "properties": {}}}},
     "previous summary is malformed"),
    (lambda s: {k: v for k, v in s.items() if k != "inputs"}, "previous summary is malformed"),
    (lambda s: s | {"nights": [{"date": "2026-11-30"}]},
     "previous summary is malformed (ValueError: nights[0] is not {night: str, date: str}"),
])
def test_unusable_previous_summary_is_a_usage_error(nights: Nights, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str], edit: Any,
                                                    message: str) -> None:
    """A previous summary from the same night, of another schema or malformed exits 2 with the reason,
    and nothing is written."""
    nights.run({"cells": [A]})
    assert nights.previous is not None
    nights.previous.write_text(json.dumps(edit(json.loads(nights.previous.read_text()))))
    capsys.readouterr()
    out = tmp_path / "refused"
    argv = ["report", str(nights.suite.last), "--out", str(out), "--night", "n2", "--previous", str(nights.previous)]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_only_a_provisioned_arch_without_results_is_lost_coverage(nights: Nights) -> None:
    """With --provisioned "sm120 sm121": an sm121 whose runner sent nothing is lost (named, exit 1), also on
    the very first night; an arch nobody provisioned is not lost, and its carried cases that never ran are
    `unprovisioned`, not missing; but a case that ran there once stays red when its arch is unprovisioned."""
    nights.provisioned = "sm120 sm121"
    code, s, md = nights.run({"cells": [B], "runner": "rtx-pro-6000"})
    assert code == 1 and s["diff"]["archs_lost"] == ["sm121"]
    assert "no results at all from: sm121" in md
    nights.provisioned = "sm120"
    nights.run({"cells": [A, B], "outcomes": {f"config_dispatch[{A}]": "skip"}})
    code, s, _ = nights.run({"cells": [B]})
    assert code == 0 and s["diff"]["archs_lost"] == [] and s["diff"]["unprovisioned"] == [KEY_A]
    assert s["diff"]["newly_missing"] == []
    nights.run({"cells": [A, B]})
    code, s, md = nights.run({"cells": [B]})
    assert code == 1 and s["diff"]["unprovisioned"] == [] and s["diff"]["newly_missing"] == [KEY_A]
    assert "sm121 is not provisioned" in s["cases"][KEY_A]["message"]


def test_a_late_runner_updates_the_nights_report_in_place(nights: Nights) -> None:
    """The later cron reports night n2 with sm121 still out; when sm121 arrives, the same night is reported again
    against that partial report: the diff is against n1 (not against n2's own partial), nothing is counted
    twice, the report says it is this night's second, and the night is green."""
    sm120 = {"cells": [B], "runner": "rtx-pro-6000"}
    sm121 = {"cells": [A], "runner": "gb10"}
    nights.run(sm120, sm121)
    code, s, md = nights.run(sm120)
    assert code == 1 and s["night"] == "n2" and s["diff"]["newly_missing"] == [KEY_A]
    partial = nights.previous
    nights.n -= 1  # the same night, reported again
    code, s, md = nights.run(sm120, sm121)
    assert nights.previous == partial and code == 0, md  # the same outputs, rewritten
    assert (s["night"], s["previous_night"], s["updates"]) == ("n2", "n1", 2)
    assert s["cases"][KEY_A]["history"] == "passed@0.11.1" and s["diff"]["newly_missing"] == []
    assert "report 2 of this night" in md and "sm121 (gb10) at 20" in md
