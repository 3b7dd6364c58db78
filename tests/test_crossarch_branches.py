"""Every branch of the cross-arch judgement (report.crossarch) and of the greedy-output property values it reads
(quantmatrix.properties): fast, no pytest run or report written (what the mutation run reruns per mutant)."""

from __future__ import annotations

import pytest

from quantmatrix import properties as P
from quantmatrix.report import crossarch
from quantmatrix.report.crossarch import Output, judge
from quantmatrix.report.model import DISAGREE, DIVERGED, CaseResult


def _top(*prompts: list[list[int]], k: int = 2) -> P.TopK:
    return P.TopK(k, list(prompts))


REF = Output([[1, 2, 3], [7, 8]], _top([[1, 9], [2, 9], [3, 9]], [[7, 9], [8, 9]]))


def test_identical_tokens_have_nothing_to_judge_but_a_ragged_prompt_is_red():
    assert judge(REF, REF) == (False, "identical")
    assert judge(REF, Output([[1, 2, 3], [7]], REF.top)) == (True, "prompt 1: 1 tokens vs 2")


def test_unreadable_tokens_or_another_prompt_count_are_red():
    assert judge(REF, Output(None, None)) == (True, "greedy_token_ids is not a JSON list of lists of ints")
    assert judge(Output(None, None), REF) == (True, "greedy_token_ids is not a JSON list of lists of ints")
    assert judge(REF, Output([[1, 2, 3]], None)) == (True, "1 prompts vs 2")


def test_without_a_top_k_on_either_side_a_divergence_is_red():
    other = Output([[1, 5, 3], [7, 8]], None)
    assert judge(REF, other) == (True, "prompt 0 diverges at token 1: 5 vs 2 (no top-k recorded)")
    assert judge(Output(REF.tokens, None), Output(other.tokens, REF.top))[0]
    assert judge(REF, Output([[1, 2, 3], [9, 8]], None)) == (
        True, "prompt 1 diverges at token 0: 9 vs 7 (no top-k recorded)")  # after an identical prompt
    assert judge(REF, Output([[1, 5, 3], [9, 8]], None)) == (
        True, "prompt 0 diverges at token 1: 5 vs 2 (no top-k recorded); 1 more outside the top-k")


def test_each_token_in_the_others_top_k_is_a_near_tie_not_red():
    other = Output([[1, 9, 4], [7, 8]], _top([[1, 9], [9, 2], [4, 0]], [[7, 9], [8, 9]]))
    assert judge(REF, other) == (False, "near-tie: prompt 0 diverges at token 1: 9 vs 2 (ranks 2 and 2 in each "
                                        "other's top-2)")


@pytest.mark.parametrize("mine", [[9, 5], [5, 9]])
def test_one_token_outside_the_others_top_k_is_red(mine):
    """Either way round: the reference never ranked 5, or this arch never ranked 2 (both are within k = 2 of
    their own side)."""
    other = Output([[1, mine[0], 0], [7, 8]], _top([[1, 0], mine, [0, 0]], [[7, 9], [8, 9]]))
    red, detail = judge(REF, other)
    assert red and detail.startswith(f"prompt 0 diverges at token 1: {mine[0]} vs 2 (ranks ")


def test_k_is_the_smaller_of_the_two_recorded():
    """The reference ranked this arch's 6 third: within its own top-3, outside a top-2 this arch recorded."""
    ref = Output([[1, 2]], P.TopK(3, [[[1, 9, 8], [2, 9, 6]]]))
    other = Output([[1, 6]], P.TopK(2, [[[1, 9], [6, 2]]]))
    assert judge(ref, other) == (True, "prompt 0 diverges at token 1: 6 vs 2 (ranks >2 and 2 in each other's "
                                       "top-2)")
    assert not judge(ref, Output(other.tokens, P.TopK(3, other.top.ranked)))[0]
    # and this arch's longer list is cut too: the reference's 2 is its third choice
    assert judge(Output([[1, 2]], P.TopK(2, [[[1, 9], [2, 6]]])), Output([[1, 6]], P.TopK(3, [[[1, 9, 8], [6, 9, 2]]]))
                 ) == (True, "prompt 0 diverges at token 1: 6 vs 2 (ranks 2 and >2 in each other's top-2)")


def test_every_prompt_counts_the_first_red_one_is_named():
    ref = Output([[1], [2], [3], [4]], _top([[1, 5]], [[2, 6]], [[3, 9]], [[4, 9]]))
    other = Output([[5], [6], [7], [8]], _top([[5, 1]], [[6, 2]], [[7, 0]], [[8, 0]]))
    assert judge(ref, other) == (True, "prompt 2 diverges at token 0: 7 vs 3 (ranks >2 and >2 in each other's "
                                       "top-2); 1 more outside the top-k, 2 near-ties")
    ties = Output([[5], [6], [3], [4]], other.top)
    assert judge(ref, ties) == (False, "near-tie: prompt 0 diverges at token 0: 5 vs 1 (ranks 2 and 2 in each "
                                       "other's top-2); 1 more near-ties")
    one_red = Output([[5], [2], [7], [4]], other.top)
    assert judge(ref, one_red) == (True, "prompt 2 diverges at token 0: 7 vs 3 (ranks >2 and >2 in each other's "
                                         "top-2); 1 near-ties")
    assert judge(ref, Output([[1], [2], [7], [4]], other.top)) == (
        True, "prompt 2 diverges at token 0: 7 vs 3 (ranks >2 and >2 in each other's top-2)")


def _case(arch: str, tokens: str | None, top: P.TopK | None = None, outcome: str = "passed",
          mode: str = "default") -> CaseResult:
    own = {P.DEVICE_NAME: f"GPU {arch}"} if arch != "sm80" else {}
    if tokens is not None:
        own[P.GREEDY_TOKEN_IDS] = tokens
    if top is not None:
        own[P.GREEDY_TOP_K] = P.encode_top_k(top)
    key = f"s::test_degeneration[ck@{arch}-{mode}]"
    return CaseResult(key, outcome, own, {}, ("ck", arch, mode, "degeneration", "bf16"), "")


def test_agreement_groups_by_checkpoint_mode_and_check_and_judges_the_minority():
    """sm100 and sm120 agree, so they are the reference; sm121 parts outside the top-k (red, both tags); the
    eager mode and a case without tokens are compared with nobody; a missing case is not compared."""
    top = _top([[1, 9], [2, 9]])
    cases = [_case("sm120", "[[1,2]]", top), _case("sm121", "[[1,5]]", _top([[1, 9], [5, 9]])),
             _case("sm100", "[[1,2]]", top), _case("sm121", "[[7]]", mode="eager"), _case("sm90", None),
             _case("sm89", "[[3]]", outcome="missing")]
    (d,) = crossarch.agreement(cases)
    assert (d["checkpoint"], d["mode"], d["check"], d["red"]) == ("ck", "default", "degeneration", True)
    assert [r["arch"] for r in d["reference"]] == ["sm100", "sm120"]
    assert d["differs"] == [{"arch": "sm121", "device": "GPU sm121", "case": cases[1].key, "red": True,
                             "detail": "prompt 0 diverges at token 1: 5 vs 2 (ranks >2 and >2 in each other's "
                                       "top-2)"}]
    assert cases[1].tags == {DISAGREE, DIVERGED} and not cases[0].tags and not cases[2].tags


def test_agreement_a_near_tie_is_tagged_but_not_diverged_and_a_tie_of_counts_takes_the_first_arch():
    cases = [_case("sm121", "[[1,9]]", _top([[1, 9], [9, 2]])), _case("sm120", "[[1,2]]", _top([[1, 9], [2, 9]]))]
    (d,) = crossarch.agreement(cases)
    assert (d["red"], [r["arch"] for r in d["reference"]], d["differs"][0]["arch"]) == (False, ["sm120"], "sm121")
    assert cases[0].tags == {DISAGREE}


def test_agreement_identical_outputs_and_unreadable_ones():
    """Groups that agree (in text, or only once parsed) are passed over and the next group is still judged;
    each unreadable output is a group of its own, never a majority with another unreadable one."""
    same = [_case("sm120", "[[1]]", mode="a"), _case("sm121", "[[1]]", mode="a")]
    spelt = [_case("sm120", "[[1, 2]]", mode="b"), _case("sm121", "[[1,2]]", mode="b")]
    bad = [_case("sm120", "[[1]]", mode="c"), _case("sm121", "not json", mode="c"), _case("sm122", "[", mode="c")]
    (d,) = crossarch.agreement(same + spelt + bad)
    assert (d["mode"], [r["arch"] for r in d["reference"]], [x["arch"] for x in d["differs"]]) == (
        "c", ["sm120"], ["sm121", "sm122"])
    assert d["differs"][0]["detail"] == "greedy_token_ids is not a JSON list of lists of ints"
    assert d["red"]


def test_agreement_names_each_side_by_arch_device_and_case():
    """Two references and two differing archs, one without a device name: all named, in arch order."""
    cases = [_case("sm120", "[[1]]"), _case("sm100", "[[1]]"), _case("sm121", "[[2]]"), _case("sm80", "[[3]]")]
    (d,) = crossarch.agreement(cases)
    assert d["reference"] == [{"arch": "sm100", "device": "GPU sm100", "case": cases[1].key},
                              {"arch": "sm120", "device": "GPU sm120", "case": cases[0].key}]
    assert [(x["arch"], x["device"], x["case"]) for x in d["differs"]] == [("sm80", "", cases[3].key),
                                                                         ("sm121", "GPU sm121", cases[2].key)]
    (lone,) = crossarch.agreement([_case("sm80", "[[1]]"), _case("sm121", "[[2]]")])
    assert lone["reference"] == [{"arch": "sm80", "device": "", "case": "s::test_degeneration[ck@sm80-default]"}]
    assert crossarch.describe_disagreement(d) == (
        "ck / default / degeneration: sm80 differs from sm100 (GPU sm100), sm120 (GPU sm120): prompt 0 diverges "
        "at token 0: 3 vs 1 (no top-k recorded); sm121 (GPU sm121) differs from sm100 (GPU sm100), sm120 "
        "(GPU sm120): prompt 0 diverges at token 0: 2 vs 1 (no top-k recorded)")


def test_describe_names_each_side_with_its_device_or_its_arch_alone():
    d = {"checkpoint": "ck", "mode": "m", "check": "c", "reference": [{"arch": "sm120", "device": ""}],
         "differs": [{"arch": "sm121", "device": "GB10", "detail": "x"}]}
    assert crossarch.describe_disagreement(d) == "ck / m / c: sm121 (GB10) differs from sm120: x"


@pytest.mark.parametrize("raw", [None, "", "nope", "[1, 2]", "[[1, 2.0]]", "[[true]]", "[[[1]]]", "{}",
                                 "[" * 100_000 + "]" * 100_000, "[[" + "9" * 5000 + "]]"])
def test_tokens_that_are_not_a_list_of_lists_of_ints_read_as_none(raw):
    assert P.decode_tokens(raw) is None


@pytest.mark.parametrize("raw", [None, "[]", '{"k": 0, "ranked": []}', '{"k": 2}', '{"k": 2.0, "ranked": []}',
                                 '{"k": 2, "ranked": [[1, 2]]}', '{"k": true, "ranked": []}'])
def test_a_top_k_of_another_shape_reads_as_none(raw):
    assert P.decode_top_k(raw) is None


def test_greedy_values_round_trip_and_a_position_beyond_the_record_ranks_nothing():
    assert P.decode_tokens(P.encode_tokens([[1, 2], []])) == [[1, 2], []]
    assert P.encode_tokens([(1, 2)]) == "[[1,2]]"
    top = P.TopK(3, [[[5, 6, 7]], []])
    assert P.decode_top_k(P.encode_top_k(top)) == top
    assert (top.at(0, 0, 2), top.at(0, 1, 2), top.at(1, 0, 2), top.at(2, 0, 2)) == ([5, 6], [], [], [])
    assert P.engine_timing("load_s") == "engine_load_s"
