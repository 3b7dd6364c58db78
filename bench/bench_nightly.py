"""Fifteen scripted nights of the nightly (tests/nightly_sim.py's runners and report), asserting each night's exit
code and headline: a failure, a skip that stays untested, a runner offline past the history window, a same-day
return, a cancelled night, a broken wheel, a cross-arch divergence, a waiver that acknowledges a lost case and then
expires, and a matrix change that drops it. tests/test_nightly_simulation.py keeps a few of these nights inside
the test suite's time budget; this is the whole story (eleven arch jobs: 44 s alone on the shared 2-core VM,
~240 s inside a loaded `pytest tests -n 2`, which is why it left tests/).

Each night's assertions fail on the code issue 28 started from (its closing note lists how): a skip or a missing
case turned green after a night or after the history window, a second report of one night exited 2, a cancelled
night had no report, and no night printed a headline.

Run: `.venv/bin/python bench/bench_nightly.py` (pytest over this file; extra arguments go to pytest).
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the harness and the stand-in vLLM

from nightly_sim import GREEN, TODAY, A, B, Nightly, counts, nightly  # noqa: E402,F401 (the fixture)

EXPIRES = TODAY + datetime.timedelta(days=12)  # the waiver of nights 12-14: live on night 12, expired from 13
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


def test_fifteen_nights_each_with_its_exit_code_and_headline(nightly: Nightly) -> None:  # noqa: F811
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


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
