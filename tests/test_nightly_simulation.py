"""Scripted nights of the nightly through tests/nightly_sim.py (the real plugin's JUnit per arch runner, the real
`quantmatrix report` with the previous night's summary), as two stories that xdist runs side by side (each its own
repository and history): six nights of runners (a missing runner stays red past the history window, a runner
back the same day replaces the night's report, a cancelled night is red), and ten nights of results (a failure,
skips that stay red, a broken wheel, a cross-arch divergence, a waiver that acknowledges a lost case and then
expires, a matrix change that drops it). Sixteen nights, fifteen arch jobs.

Each night's assertions fail on the code issue 28 started from: a missing case turned green after the history
window, a second report of one night exited 2, a cancelled night had no report, and no night printed a headline.
"""

from __future__ import annotations

import datetime

from nightly_sim import GREEN, TODAY, A, B, Nightly, counts, nightly  # noqa: F401 (the fixture)

EXPIRES = TODAY + datetime.timedelta(days=7)  # the waiver of nights 7-9: live on night 7, expired from 8
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


def test_six_nights_each_with_its_exit_code_and_headline(nightly: Nightly) -> None:  # noqa: F811
    """History window: 2 nights. 1 both runners green. 2-4 the sm121 runner is offline: its cases missing, red on
    night 4 too, past the window, naming when they last ran. 5 the 10:17 cron reports without sm121, which comes
    back the same day: the night's report is replaced, diffed against night 4, green, "report 2 of this night".
    6 the night is cancelled after sm120 reported: red, saying so."""
    n = nightly
    sm120, sm121 = n.runner("sm120"), n.runner("sm121")
    assert n.report(1, sm120, sm121)[:2] == (0, GREEN)

    assert n.report(2, sm120)[:2] == (1, f"❌ no results at all from sm121; {counts(newly_untested=2)}")
    for night in (3, 4):
        code, headline, s = n.report(night, sm120)
        assert (code, headline) == (1, f"❌ no results at all from sm121; {counts(still_untested=2)}")
    assert "tested last on n1, not since" in s["cases"][A]["message"] and s["cases"][A]["history"] == "missing missing"

    code, headline, _ = n.report(5, sm120, conclusion="in_progress")
    assert (code, headline) == (1, f"❌ no results at all from sm121; {counts(still_untested=2)}")
    code, headline, s = n.report(5, sm120, sm121, conclusion="success")
    assert (code, headline, s["night"], s["previous_night"], s["updates"]) == (0, GREEN, "n5", "n4", 2)

    code, headline, _ = n.report(6, sm120, conclusion="cancelled")
    assert (code, headline) == (1, "❌ the nightly run was cancelled or replaced by a newer run: this night is "
                                   "incomplete; no results at all from sm121; " + counts(newly_untested=2))

def test_ten_nights_of_results_each_with_its_exit_code_and_headline(nightly: Nightly) -> None:  # noqa: F811
    """History window: 2 nights. 1 both runners green. 2 sm121 degenerates: two new failures. 3 sm121's run hits
    its time limit: both cases "not run", newly untested. 4 again: still untested, red (a skip never turns green
    by repetition). 5 sm121's new wheel does not import: one shared cause, red. 6 sm121's kernel parts from
    sm120's tokens outside the top-k: red on cross-arch divergence alone. 7 sm121 stops running tiny-b under a
    live waiver: acknowledged, green. 8 the waiver expired: red again. 9 still red past the window. 10 the matrix
    drops tiny-b on sm121: removed, green."""
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

    code, headline, s = n.report(5, sm120, n.runner("sm121", broken=True))
    cuda = "AttributeError: module 'cuda.bindings.runtime' has no attribute 'cudaLibrary_t'"
    quantization = "vllm.model_executor.layers.quantization"
    assert (code, headline) == (1, f"❌ vLLM under test broken on sm121 (sm121-1): config (import {quantization}: "
                                   f"{cuda}); layers (import {quantization} (inside {quantization}.modelopt): {cuda}); "
                                   f"engine (import vllm.entrypoints.llm: {cuda}); {counts(new=2)}")
    assert s["totals"]["not tested (vLLM broken)"] == 2

    code, headline, s = n.report(6, sm120, n.runner("sm121", "outside"))
    assert (code, headline, s["totals"]["failed"]) == (1, "❌ 2 cross-arch divergences outside the top-k", 0)

    without_b = n.runner("sm121", "reference", "-k", "not tiny-b", extra=WAIVER)
    sm120_w = n.runner("sm120", extra=WAIVER)
    code, headline, s = n.report(7, sm120_w, without_b)
    assert (code, headline, s["diff"]["acknowledged"]) == (0, GREEN, [B])
    assert s["cases"][B]["properties"]["waiver_reason"] == "GB10 runner short of disk for tiny-b"
    code, headline, s = n.report(8, sm120_w, without_b)  # the day after the waiver's last day
    assert (code, headline, s["diff"]["still_missing"]) == (1, f"❌ {counts(still_untested=1)}", [B])
    assert n.report(9, sm120_w, without_b)[:2] == (1, f"❌ {counts(still_untested=1)}")

    code, headline, s = n.report(10, n.runner("sm120", extra=DROPPED), n.runner("sm121", extra=DROPPED))
    assert (code, headline, s["diff"]["removed"], B in s["cases"]) == (0, GREEN, [B], False)

