"""Six scripted nights of the nightly through tests/nightly_sim.py (the real plugin's JUnit per arch runner, the
real `quantmatrix report` with the previous night's summary), two arch jobs in all: a missing runner stays red
past the history window, a runner back the same day replaces the night's report, a cancelled night is red. The
fifteen-night story (skips, broken wheel, divergence, waivers, matrix drop) is bench/bench_nightly.py.

Each night's assertions fail on the code issue 28 started from: a missing case turned green after the history
window, a second report of one night exited 2, a cancelled night had no report, and no night printed a headline.
"""

from __future__ import annotations

from nightly_sim import GREEN, A, Nightly, counts, nightly  # noqa: F401 (the fixture)


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
