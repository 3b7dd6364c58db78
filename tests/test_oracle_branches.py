"""Every branch of the quality oracles (checks/quality.py), each threshold at its boundary and each message in
full: a verdict whose arithmetic or wording drifts must turn a test red (bench/mutation.py measures it)."""

from __future__ import annotations

import pytest

from quantmatrix.checks import quality
from quantmatrix.checks.quality import AccuracyVerdict, Degeneration, Divergence

LIMITS = {"max_repeat_run": 20, "min_distinct_1": 0.2, "min_distinct_2": 0.3, "max_compression_ratio": 6.0}


def _stats(run: int = 20, d1: float = 0.2, d2: float = 0.3, ratio: float = 6.0) -> Degeneration:
    return Degeneration(run, 3, d1, d2, ratio)


def _out(tokens: list[int], top: list[dict[int, float]]) -> dict:
    return {"prompt_token_ids": [1], "token_ids": tokens,
            "logprobs": [{str(k): v for k, v in d.items()} for d in top]}


# ------------------------------------------------------------------------------------------ degeneration


def test_every_threshold_exactly_at_its_limit_passes():
    """A limit is allowed: each comparison is strict (a run of max_repeat_run is fine, one more is not)."""
    assert _stats().crossed(LIMITS) == []


@pytest.mark.parametrize(("stats", "message"), [
    (_stats(run=21), "one token repeated 21 times in a row (prompt 3) > max_repeat_run 20"),
    (_stats(d1=0.199), "distinct-1 0.199 < min_distinct_1 0.2"),
    (_stats(d2=0.299), "distinct-2 0.299 < min_distinct_2 0.3"),
    (_stats(ratio=6.01), "compression ratio 6.01 > max_compression_ratio 6.0"),
])
def test_each_threshold_just_past_its_limit_is_named_with_both_numbers(stats, message):
    assert stats.crossed(LIMITS) == [message]


def test_summary_states_every_statistic():
    assert Degeneration(7, 0, 0.5, 0.75, 1.5).summary() == (
        "max_repeat_run 7, distinct-1 0.500, distinct-2 0.750, compression ratio 1.50")


def test_degeneration_statistics_of_two_prompts():
    """The worst prompt is the one with the longest run; distinct-n counts n-grams within each prompt only."""
    d = quality.degeneration([[1, 2, 3], [4, 4, 4, 5]])
    assert (d.max_repeat_run, d.worst_prompt) == (3, 1)
    assert d.distinct_1 == 5 / 7  # tokens 1 2 3 4 5 of 7
    assert d.distinct_2 == 4 / 5  # (1,2) (2,3) (4,4) (4,5) of 5: (4,4) twice, and no (3,4) across prompts


def test_the_worst_prompt_may_be_the_first():
    assert quality.degeneration([[2, 2, 2], [1, 2], [3, 3]]).worst_prompt == 0


def test_degeneration_of_nothing_is_all_zero():
    assert quality.degeneration([]) == Degeneration(0, 0, 0.0, 0.0, 0.0)
    assert quality.degeneration([[9]]).distinct_2 == 0.0  # one token: no bigram at all


def test_compression_ratio_is_raw_over_zlib_size_of_four_byte_tokens():
    assert quality.compression_ratio([]) == 0.0
    assert quality.compression_ratio([[7] * 64]) == 256 / 15  # a loop compresses to 15 bytes
    assert quality.compression_ratio([[1, 2], [1, 2]]) == 16 / 17  # varied text does not compress


@pytest.mark.parametrize(("tokens", "run"), [([3, 3, 4], 2), ([4, 3, 3], 2), ([0, 0], 2), ([], 0), ([5], 1)])
def test_longest_run_wherever_it_is(tokens, run):
    assert quality.longest_run(tokens) == run


# ------------------------------------------------------------------------------------------- agreement


def test_top_k_ranks_by_logprob_and_keeps_k():
    lps = {"1": -3.0, "2": -0.5, "3": -1.0, "4": None}
    assert quality.top_k(lps, 2) == [2, 3]
    assert quality.top_k(lps, 5) == [2, 3, 1]


def test_a_divergence_must_be_within_top_k_both_ways():
    """Our token in their top-k is not enough: theirs must be in ours too (and the other way round)."""
    ours_sees_theirs = _out([5], [{5: -0.1, 6: -0.2}])
    ours_blind = _out([5], [{5: -0.1, 7: -0.2}])
    theirs_sees_ours = _out([6], [{6: -0.1, 5: -0.2}])
    theirs_blind = _out([6], [{6: -0.1, 7: -0.2}])
    assert quality.first_divergence(0, ours_sees_theirs, theirs_sees_ours, 2).within_top_k
    assert not quality.first_divergence(0, ours_blind, theirs_sees_ours, 2).within_top_k
    assert not quality.first_divergence(0, ours_sees_theirs, theirs_blind, 2).within_top_k


def test_a_token_ranked_just_past_k_is_not_within_top_k():
    """k is the cut: the other's token at rank k + 1 is a disagreement (at rank k it is a near-tie)."""
    ours = _out([5], [{5: -0.1, 9: -0.2, 6: -0.3}])
    theirs = _out([6], [{6: -0.1, 7: -0.2, 5: -0.3}])
    assert not quality.first_divergence(0, ours, theirs, 2).within_top_k
    assert quality.first_divergence(0, ours, theirs, 3).within_top_k
    assert [d.within_top_k for d in quality.compare([ours], [theirs], 2)] == [False]
    assert [d.within_top_k for d in quality.compare([ours], [theirs], 3)] == [True]


def test_k_cuts_each_side_on_its_own():
    """Our token at rank 3 of theirs fails k = 2 even when theirs is at rank 2 of ours, and the other way round."""
    near, far = {5: -0.1, 6: -0.2}, {6: -0.1, 7: -0.2, 5: -0.3}
    assert not quality.first_divergence(0, _out([5], [near]), _out([6], [far]), 2).within_top_k
    assert not quality.first_divergence(0, _out([6], [far]), _out([5], [near]), 2).within_top_k


def test_exact_fails_even_where_each_token_tops_the_others_list():
    """Logprobs where each run ranks the other's token first (k = 1 would call it a near-tie): exact still fails."""
    a, b = _out([1], [{2: -0.1, 1: -0.5}]), _out([2], [{1: -0.1, 2: -0.5}])
    assert quality.compare([a], [b], 1)[0].within_top_k
    assert [d.within_top_k for d in quality.exact([a], [b])] == [False]


def test_sequences_that_never_part_are_compared_over_the_shorter():
    d = quality.first_divergence(4, _out([1, 2, 3], [{1: -1}] * 3), _out([1, 2], [{1: -1}] * 2), 1)
    assert d == Divergence(4, 2, 2, None, None, True) and not d.diverged


def test_a_divergence_at_the_first_position_is_a_divergence():
    d = quality.first_divergence(0, _out([1, 2], [{1: -1}] * 2), _out([3, 2], [{3: -1}] * 2), 1)
    assert (d.position, d.length, d.token, d.other, d.diverged) == (0, 2, 1, 3, True)


def test_compare_needs_the_same_prompt_set():
    a = _out([1], [{1: -1}])
    assert [d.prompt for d in quality.compare([a, a], [a, a], 1)] == [0, 1]
    with pytest.raises(ValueError, match=r"^2 continuations against 1: not the same prompt set$"):
        quality.compare([a, a], [a], 1)


def test_exact_fails_a_near_tie_and_passes_identity():
    a, b = _out([1, 2], [{1: -1}, {2: -1.0, 3: -1.0}]), _out([1, 3], [{1: -1}, {3: -1.0, 2: -1.0}])
    assert quality.exact([a], [b]) == [Divergence(0, 1, 2, 2, 3, False)]
    assert quality.exact([a], [a]) == [Divergence(0, 2, 2, None, None, True)]


def test_prompt_mismatch_names_count_or_prompt():
    a, b = _out([1], [{1: -1}]), {**_out([1], [{1: -1}]), "prompt_token_ids": [2]}
    assert quality.prompt_mismatch([a], [a]) is None
    assert quality.prompt_mismatch([a, a], [a]) == "2 prompts here, 1 there"
    assert quality.prompt_mismatch([a, a], [a, b]) == "prompt 1 tokenizes to [1] here, [2] there"


def test_describe_says_where_and_how_each_prompt_parted():
    divs = [Divergence(0, 4, 4, None, None, True), Divergence(1, 2, 4, 7, 8, True),
            Divergence(2, 0, 4, 5, 6, False)]
    assert quality.describe(divs) == (
        "  prompt 0: identical over 4 tokens\n"
        "  prompt 1: first divergence at position 2: 7 here vs 8 there (within each other's top-k)\n"
        "  prompt 2: first divergence at position 0: 5 here vs 6 there (NOT within each other's top-k)")


# -------------------------------------------------------------------------------------------- accuracy


def test_wilson_interval_needs_a_trial():
    with pytest.raises(ValueError, match="^a Wilson interval needs at least one trial$"):
        quality.wilson_interval(0, 0, 1.96)


def test_wilson_interval_stays_within_0_and_1():
    """At 5/5 and z = 1.96 the upper bound computes to 1 + 2e-16 in floating point: it is clamped to 1."""
    assert quality.wilson_interval(5, 5, 1.96)[1] == 1.0
    assert quality.wilson_interval(0, 5, 1.96)[0] == 0.0


def test_wilson_interval_of_one_trial():
    low, high = quality.wilson_interval(1, 1, 1.0)
    assert (low, high) == (pytest.approx(0.5), 1.0)  # centre (1 + 1/2) / 2, half 1/4 / ... -> [0.5, 1]


def test_accuracy_exactly_on_the_pass_line_passes():
    """ok is `>=`: a reference of 0/10 has Wilson lower bound 0.0, so 0/10 with max_drop 0 is on the line."""
    on_line = AccuracyVerdict(0, 10, 0, 10, 1.96, 0.0)
    assert on_line.bound == 0.0 and on_line.accuracy == 0.0 and on_line.ok
    assert not AccuracyVerdict(0, 10, 0, 10, 1.96, -0.1).ok  # a negative drop raises the line above 0


def test_accuracy_pass_line_subtracts_max_drop():
    v = AccuracyVerdict(7, 10, 9, 10, 1.96, 0.25)
    low = quality.wilson_interval(9, 10, 1.96)[0]
    assert v.accuracy == 0.7 and v.bound == low - 0.25 and v.ok
    assert v.arithmetic() == (f"accuracy 7/10 = 0.700; reference 9/10 = 0.900, Wilson interval (z=1.96) "
                              f"[{low:.3f}, 0.982]; pass line = lower bound {low:.3f} - max_drop 0.25 = "
                              f"{low - 0.25:.3f}")


def test_score_strips_the_answer_and_skips_blank_lines():
    assert quality.score(["  \n\t\n 7 apples", "x7"], [" 7 ", "7"]) == [True, False]
    assert quality.score(["", " \n "], ["X", "XX"]) == [False, False]  # no line at all answers nothing
    with pytest.raises(ValueError):
        quality.score(["7"], ["7", "8"])  # strict: one answer per completion
