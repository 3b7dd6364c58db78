"""Every branch of the nightly diff (report/diff.py) on constructed nights: last night's summary read or refused,
history strings, the flaky rule at its boundary, every tag, the bisect range and what finish() carries over;
and the waiver rules of report/read.py (a waived case, a waiver on its last day, an expired one).
tests/test_report_diff.py runs the same rules end to end through real pytest runs (seconds per night); these take
milliseconds, so bench/mutation.py can rerun them for every mutant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantmatrix import properties as P
from quantmatrix.errors import ReportError
from quantmatrix.report import diff
from quantmatrix.report.diff import Differ, Previous
from quantmatrix.report.model import SCHEMA, CaseResult, Input, summary_entry

KEY = "suites/test_dispatch.py::test_config_dispatch[ck@sm121-default]"
OTHER = "suites/test_dispatch.py::test_config_dispatch[ck@sm120-default]"


def _case(outcome: str, key: str = KEY, arch: str = "sm121", **own: str) -> CaseResult:
    return CaseResult(key, outcome, own, {}, ("ck", arch, "default", "config_dispatch", "w4a4"),
                      summary_entry(key, outcome, own, 0.0, "", ""))


def _prev(cases: dict[str, dict], nights: int = 2, common: dict | None = None) -> Previous:
    older = [{"night": f"n{i}", "date": f"2026-12-0{i}"} for i in range(nights, 0, -1)]
    inputs = [{"path": "a.xml", "common": common or {}, "properties": {}}]
    return Previous(f"n{nights + 1}", f"2026-12-0{nights + 1}", older, inputs, cases)


def _was(outcome: str, history: str = "", file: int | None = None, tested: str = "", **props: str) -> dict:
    out: dict = {"outcome": outcome, "properties": props, "history": history}
    if file is not None:
        out["file"] = file
    if tested:
        out["tested"] = tested
    return out


def _diff(prev: Previous | None, case: CaseResult, history: int = 7, provisioned=None) -> CaseResult:
    Differ(prev, history, provisioned).case(case)
    return case


# ------------------------------------------------------------------------------------------- history


def test_history_entries_pair_outcome_and_vllm():
    assert diff.history_entries("passed@0.11.1 missing failed@0.11.0") == [
        ("passed", "0.11.1"), ("missing", None), ("failed", "0.11.0")]
    assert diff.history_entries("") == []


def test_no_space_keeps_a_version_one_history_entry():
    assert diff._no_space("0.11 .1\t+cu") == "0.11.1+cu"
    assert diff._no_space("") is None and diff._no_space(None) is None


@pytest.mark.parametrize(("now", "history", "flaky"), [
    ("failed", "passed failed", True),  # F P F: two changes of direction
    ("failed", "passed", False),  # one change: a plain new failure
    ("passed", "failed skipped passed", True),  # skips do not count, P F P
    ("skipped", "failed passed failed", True),  # tonight's skip ignored: F P F
    ("passed", "error", False),
    ("passed", "error passed error", True),
    ("error", "xpassed failed", True),
    ("passed", "passed passed", False),  # never red
    ("failed", "failed error", False),  # never green
    ("missing", "passed missing failed", False),  # P F: one change
])
def test_flaky_is_two_changes_of_direction(now, history, flaky):
    assert diff._alternates(now, history) is flaky


# -------------------------------------------------------------------------------------------- tagging


def test_first_night_new_failure_has_nothing_to_bisect():
    d = Differ(None, 7)
    c = _case("failed")
    d.case(c)
    assert c.tags == {"new_failure"} and c.history == "" and d.bisect == {} and d.nights == []
    assert c.entry == f'{json.dumps(KEY)}:{{"outcome":"failed","properties":{{}}}}'


def test_new_failure_names_the_last_night_it_passed():
    prev = _prev({KEY: _was("failed", "passed@0.10 passed@0.9", vllm_version="0.11")})
    d = Differ(prev, 7)
    c = _case("error")
    d.case(c)
    assert c.tags == {"still_failing"} and d.bisect == {}
    prev = _prev({KEY: _was("skipped", "passed@0.10 passed@0.9", vllm_version="0.11")})
    d = Differ(prev, 7)
    c = _case("failed")
    d.case(c)
    assert c.tags == {"new_failure"} and c.history == "skipped@0.11 passed@0.10 passed@0.9"
    assert d.bisect == {KEY: {"last_passed_night": "n2", "last_passed_vllm": "0.10"}}
    assert c.entry.endswith(',"history":"skipped@0.11 passed@0.10 passed@0.9"}')


def test_a_new_failure_that_never_passed_in_the_window_has_no_bisect_range():
    d = Differ(_prev({KEY: _was("skipped", "missing")}), 7)
    d.case(_case("failed"))
    assert d.bisect == {KEY: {"last_passed_night": None, "last_passed_vllm": None}}


def test_a_rerun_folded_into_a_case_replaces_its_bisect_entry():
    d = Differ(_prev({KEY: _was("passed")}), 7)
    d.case(_case("failed"))
    assert KEY in d.bisect
    d.case(_case("passed"))
    assert d.bisect == {}


@pytest.mark.parametrize(("before", "now", "tags"), [
    ("failed", "passed", {"fixed"}), ("error", "xpassed", {"fixed"}), ("passed", "passed", set()),
    ("passed", "skipped", {"newly_skipped"}), ("waived", "skipped", {"newly_skipped"}),
    ("error", "skipped", {"newly_skipped"}), ("skipped", "skipped", set()), ("missing", "skipped", set()),
    ("passed", "missing", {"newly_missing"}), ("missing", "missing", {"still_missing"}),
    ("passed", "waived", set()), ("failed", "waived", set()),
])
def test_each_tag_from_last_night_to_tonight(before, now, tags):
    assert _diff(_prev({KEY: _was(before)}), _case(now)).tags == tags


def test_a_missing_case_of_an_arch_without_a_runner_is_unprovisioned_unless_it_was_tested():
    """A case of an arch nobody provisions that never ran is only `unprovisioned`; one that ran once is lost
    coverage like any other (an arch taken out of QM_PROVISIONED_ARCHS does not turn its cases green)."""
    never = _prev({KEY: _was("skipped")})
    assert _diff(never, _case("missing"), provisioned=frozenset({"sm120"})).tags == {"unprovisioned"}
    assert _diff(never, _case("missing"), provisioned=frozenset({"sm121"})).tags == {"newly_missing"}
    ran = _prev({KEY: _was("passed")})
    assert _diff(ran, _case("missing"), provisioned=frozenset({"sm120"})).tags == {"newly_missing"}
    assert _diff(ran, _case("missing"), provisioned=frozenset({"sm121"})).tags == {"newly_missing"}


@pytest.mark.parametrize(("was", "now", "tags", "tested"), [
    (_was("skipped", "skipped passed"), "skipped", {"still_skipped"}, "n1"),  # ran two nights back
    (_was("skipped", tested="n0"), "skipped", {"still_skipped"}, "n0"),  # ran before the window: `tested` says
    (_was("missing", "missing", tested="n0"), "missing", {"still_missing"}, "n0"),
    (_was("skipped", "skipped skipped"), "skipped", set(), ""),  # never ran: nothing was lost
    (_was("skipped", tested="n0"), "passed", set(), "n3"),  # ran tonight: tested tonight
    (_was("skipped", tested="n0"), "failed", {"new_failure"}, "n3"),
])
def test_a_case_that_ran_once_stays_lost_every_night_it_is_untested(was, now, tags, tested):
    d = Differ(_prev({KEY: was}), 7, night="n3")
    c = _case(now)
    d.case(c)
    assert (c.tags, c.tested) == (tags, tested)
    assert c.entry.endswith(f',"tested":"{tested}"}}' if tested else "}")


@pytest.mark.parametrize(("expires", "expired", "tags"), [
    ("2026-12-04", "false", {"acknowledged"}),  # its last day still counts
    ("2026-12-03", "false", {"still_skipped"}),  # past it: lost again
    ("2099-01-01", "true", {"still_skipped"}),  # the plugin said it expired
])
def test_a_live_waiver_acknowledges_an_untested_case(expires, expired, tags):
    import datetime

    waiver = {P.WAIVER_REASON: "r", P.WAIVER_LINK: "l", P.WAIVER_EXPIRES: expires, P.WAIVER_EXPIRED: expired}
    d = Differ(_prev({KEY: _was("skipped", tested="n0")}), 7, night="n3", today=datetime.date(2026, 12, 4))
    c = _case("skipped", **waiver)
    d.case(c)
    assert c.tags == tags


def test_alternating_outcomes_are_also_flaky():
    c = _diff(_prev({KEY: _was("failed", "passed")}), _case("passed"))
    assert c.tags == {"fixed", "flaky"} and c.history == "failed passed"


# -------------------------------------------------------------------------------------------- history


def test_history_takes_vllm_from_the_case_or_its_file_and_none_for_a_missing_night():
    prev = _prev({KEY: _was("passed", file=0), OTHER: _was("missing", "passed@0.9")},
                 common={P.VLLM_VERSION: "0.11 rc1"})
    assert _diff(prev, _case("passed")).history == "passed@0.11rc1"
    assert _diff(prev, _case("passed", OTHER)).history == "missing passed@0.9"
    prev.inputs[0] = {"path": "a.xml", "common": {}, "properties": {P.VLLM_VERSION: "0.12"}}
    assert _diff(prev, _case("passed")).history == "passed@0.12"
    assert _diff(_prev({KEY: _was("passed", vllm_version="0.13")}), _case("passed")).history == "passed@0.13"
    assert _diff(_prev({KEY: _was("passed")}), _case("passed")).history == "passed"


def test_history_keeps_exactly_the_nights_asked_for():
    prev = _prev({KEY: _was("failed", "passed skipped passed")})
    assert _diff(prev, _case("passed"), history=2).history == "failed passed"
    assert _diff(prev, _case("passed"), history=3).history == "failed passed skipped"
    assert _diff(prev, _case("passed"), history=4).history == "failed passed skipped passed"
    assert _diff(prev, _case("passed"), history=1).history == "failed"


def test_the_nights_window_is_last_night_then_its_own_nights():
    d = Differ(_prev({}, nights=3), 3)
    assert [n["night"] for n in d.nights] == ["n4", "n3", "n2"]


# ------------------------------------------------------------------------------------------------ finish


def _input(*archs: str) -> Input:
    return Input("a.xml", 1, list(archs), {}, {})


def test_finish_carries_last_nights_cases_as_missing_and_lists_every_tag():
    prev = _prev({KEY: _was("passed", file=0), OTHER: _was("missing", "skipped"),
                  "suites/t.py::test_c[gone@sm90-default]": _was("missing", "missing missing")}, nights=2)
    d = Differ(prev, 3)
    tonight = {"suites/t.py::test_d[x@sm121-default]": _case("failed", "suites/t.py::test_d[x@sm121-default]")}
    d.case(tonight["suites/t.py::test_d[x@sm121-default]"])
    out = d.finish(tonight, [_input("sm121")])
    assert sorted(tonight) == sorted([KEY, OTHER, "suites/t.py::test_d[x@sm121-default]"])  # the gone one dropped
    assert tonight[KEY].message == ("no result tonight (tested last on n3, not since: red until it runs again, a "
                                    "waiver covers it or the matrix drops it)")
    assert tonight[OTHER].message == "no result tonight (last result: n2)"
    assert tonight[KEY].tags == {"newly_missing"} and tonight[OTHER].tags == {"still_missing"}
    assert out == {"new_failures": ["suites/t.py::test_d[x@sm121-default]"], "still_failing": [], "fixed": [],
                   "newly_skipped": [], "still_skipped": [], "newly_missing": [KEY], "still_missing": [OTHER],
                   "unprovisioned": [], "acknowledged": [], "flaky": [], "removed": [], "archs_lost": ["sm120"],
                   "nights": d.nights,
                   "bisect": {"suites/t.py::test_d[x@sm121-default]": {"last_passed_night": None,
                                                                       "last_passed_vllm": None}}}


def test_a_case_that_never_ran_and_is_missing_in_every_kept_night_is_dropped_one_that_ran_is_not():
    """Only a case with no result in the nights kept and no night it ran goes; one that ran once (here two
    nights back, outside a window of 2) is carried and stays red, naming the night it last ran."""
    prev = _prev({KEY: _was("missing", "missing skipped")})
    cases: dict[str, CaseResult] = {}
    Differ(prev, 2).finish(cases, [_input("sm121")])
    assert cases == {}
    Differ(prev, 3).finish(cases, [_input("sm121")])
    assert list(cases) == [KEY]
    cases = {}
    Differ(_prev({KEY: _was("missing", "missing passed")}), 2, night="n4").finish(cases, [_input("sm121")])
    assert cases[KEY].tags == {"still_missing"} and cases[KEY].tested == "n1" and "tested last on n1" in \
        cases[KEY].message


def _record(matrix: str, cells: list[str], waived: list[str] = ()) -> P.MatrixCases:
    w = [{"reason": "known", "link": "https://x/2", "expires": "2099-01-01", "cases": frozenset(waived)}]
    return P.MatrixCases(matrix, {"config_dispatch": frozenset(cells)}, w if waived else [])


@pytest.mark.parametrize(("records", "kept", "tags"), [
    ([_record("m.yaml", ["ck@sm120-default"])], False, None),  # its matrix ran tonight without it: dropped
    ([_record("m.yaml", ["ck@sm121-default"])], True, {"newly_missing"}),  # still defined: lost
    ([_record("other.yaml", ["x@sm90-default"])], True, {"newly_missing"}),  # its matrix did not run: lost
    ([_record("m.yaml", ["ck@sm121-default"], ["config_dispatch[ck@sm121-default]"])], True, {"acknowledged"}),
    ([], True, {"newly_missing"}),
])
def test_a_carried_case_is_dropped_only_by_its_own_matrix_and_acknowledged_by_its_waiver(records, kept, tags):
    from quantmatrix.report.coverage import Defined

    prev = _prev({KEY: _was("passed", file=0)})
    prev.inputs[0]["properties"] = {P.MATRIX: "m.yaml"}
    defined = Defined()
    for r in records:
        defined.add(r)
    cases: dict[str, CaseResult] = {}
    out = Differ(prev, 7, night="n4").finish(cases, [_input("sm120")], defined)
    assert (KEY in cases) is kept and out["removed"] == ([] if kept else [KEY])
    if kept:
        assert cases[KEY].tags == tags and cases[KEY].prop(P.MATRIX) == "m.yaml"
        assert (cases[KEY].prop(P.WAIVER_REASON) == "known") is (tags == {"acknowledged"})


def test_a_summary_of_the_same_night_rewinds_to_the_night_before_it():
    """A report of tonight written before a late runner arrived is read back as the night before it: each case's
    outcome and vLLM then, its history before that, and the night it had last run by then."""
    prev = Previous("n3", "2026-12-03", [{"night": "n2", "date": "2026-12-02"}, {"night": "n1", "date": "d1"}],
                    [{"path": "a.xml", "common": {P.VLLM_VERSION: "0.12"}, "properties": {P.MATRIX: "m.yaml"}}],
                    {KEY: _was("passed", "failed@0.11 passed@0.10", file=0, tested="n3"),
                     OTHER: _was("skipped", "passed@0.11", tested="n2"),
                     "new": _was("passed", tested="n3")}, updates=2)
    back = prev.rewound()
    assert (back.night, back.date, back.nights, back.inputs, back.updates) == (
        "n2", "2026-12-02", [{"night": "n1", "date": "d1"}], [], 2)
    assert back.cases == {
        KEY: {"outcome": "failed", "properties": {P.MATRIX: "m.yaml", P.VLLM_VERSION: "0.11"},
              "history": "passed@0.10", "tested": "n2"},
        OTHER: {"outcome": "passed", "properties": {P.VLLM_VERSION: "0.11"}, "history": "", "tested": "n2"}}
    first = Previous("n1", "d1", [], [], {KEY: _was("passed")})
    assert first.rewound() is None


def test_a_provisioned_arch_without_any_result_is_lost_even_on_a_first_night():
    out = Differ(None, 7, frozenset({"sm100", "sm121"})).finish({}, [_input("sm121")])
    assert out["archs_lost"] == ["sm100"] and out["nights"] == []
    assert Differ(None, 7).finish({}, [_input("sm121")])["archs_lost"] == []


def test_tags_are_listed_sorted_and_bisect_sorted():
    prev = _prev({KEY: _was("passed"), OTHER: _was("passed")})
    d = Differ(prev, 7)
    cases = {k: _case("failed", k, arch=a) for k, a in ((OTHER, "sm120"), (KEY, "sm121"))}
    for c in cases.values():
        d.case(c)
    out = d.finish(cases, [_input("sm120", "sm121")])
    assert out["new_failures"] == sorted([KEY, OTHER]) and list(out["bisect"]) == sorted([KEY, OTHER])


# ------------------------------------------------------------------------------------------ load_previous


def _summary(tmp_path: Path, data: object) -> Path:
    p = tmp_path / "summary.json"
    p.write_text(json.dumps(data))
    return p


GOOD = {"schema": SCHEMA, "night": "n1", "date": "2026-12-01", "nights": [{"night": "n0", "date": "2026-11-30"}],
        "inputs": [{"path": "a.xml", "common": {P.VLLM_VERSION: "1"}, "properties": {}}],
        "cases": {KEY: {"outcome": "passed", "properties": {P.ARCH: "sm121"}, "file": 0, "history": "failed"}}}


def test_load_previous_reads_a_summary_and_rebuilds_case_properties(tmp_path):
    prev = diff.load_previous(_summary(tmp_path, GOOD))
    assert (prev.night, prev.date, prev.nights) == ("n1", "2026-12-01", GOOD["nights"])
    assert prev.props(prev.cases[KEY]) == {P.VLLM_VERSION: "1", P.ARCH: "sm121"}
    assert prev.props({"properties": {"a": "b"}}) == {"a": "b"}


@pytest.mark.parametrize(("change", "error"), [
    ({"schema": 2}, "not a quantmatrix summary of schema 1 (schema: 2)"),
    ({"nights": [{"night": "n0"}]}, "previous summary is malformed (ValueError: nights[0] is not {night: str, "
                                    "date: str}: {'night': 'n0'})"),
    ({"nights": [["n0", "d"]]}, "previous summary is malformed (ValueError: nights[0] is not {night: str, "
                                "date: str}: ['n0', 'd'])"),
    ({"nights": [{"night": "n0", "date": 1}]}, "nights[0] is not {night: str, date: str}"),
    ({"inputs": [{"path": "x", "common": [], "properties": {}}]},
     "(ValueError: input 'x' has malformed common or properties)"),
    ({"inputs": [{"path": "x", "common": {}, "properties": []}]}, "input 'x' has malformed common or properties"),
    ({"cases": {KEY: {"outcome": "odd", "properties": {}}}},
     f"(ValueError: case {KEY!r} has outcome 'odd' or malformed properties, history or file)"),
    ({"cases": {KEY: {"outcome": "passed", "properties": []}}}, "has outcome 'passed' or malformed properties"),
    ({"cases": {KEY: {"outcome": "passed", "properties": {}, "history": 3}}}, "malformed properties, history"),
    ({"cases": {KEY: {"outcome": "passed", "properties": {}, "file": 1}}}, "malformed properties, history or file"),
    ({"cases": {KEY: {"outcome": "passed", "properties": {}, "file": "0"}}}, "malformed properties, history or file"),
    ({"cases": {KEY: {"outcome": "passed", "properties": {}, "history": "passed failed"}}},
     f"(ValueError: case {KEY!r} has 2 nights of history, the summary names 1)"),
    ({"cases": [1]}, "previous summary is malformed (TypeError: "),
    ({"cases": {KEY: {"outcome": "passed", "properties": {}, "tested": 3}}}, "malformed properties, history or file"),
    ({"inputs": [{"path": "x"}]}, "previous summary is malformed (KeyError: 'common')"),
])
def test_load_previous_refuses_a_malformed_summary(tmp_path, change, error):
    with pytest.raises(ReportError) as e:
        diff.load_previous(_summary(tmp_path, {**GOOD, **change}))
    assert str(e.value).startswith(f"{tmp_path / 'summary.json'}: ") and error in str(e.value)


def test_load_previous_allows_history_up_to_the_nights_named(tmp_path):
    ok = {**GOOD, "cases": {KEY: {"outcome": "passed", "properties": {}, "history": " failed "}}}
    assert diff.load_previous(_summary(tmp_path, ok)).cases[KEY]["history"] == " failed "
    many = {**GOOD, "nights": [], "cases": {KEY: {"outcome": "passed", "properties": {}, "history": "failed"}}}
    with pytest.raises(ReportError, match="has 1 nights of history, the summary names 0"):
        diff.load_previous(_summary(tmp_path, many))


@pytest.mark.parametrize(("content", "error"), [
    (None, "cannot read previous summary: No such file or directory"),
    (b"{", "previous summary is not valid JSON: Expecting property name"),
    (b"\xff", "previous summary is not valid JSON: 'utf-8' codec can't decode"),
    (b"[1]", "not a quantmatrix summary of schema 1 (schema: 'list')"),
])
def test_load_previous_names_an_unreadable_file(tmp_path, content, error):
    p = tmp_path / "summary.json"
    if content is not None:
        p.write_bytes(content)
    with pytest.raises(ReportError) as e:
        diff.load_previous(p)
    assert str(e.value).startswith(f"{p}: {error}")


# ------------------------------------------------------------------------------------------------ waivers


def _junit(*results: object, out: str | None = None) -> object:
    from junitparser import TestCase

    case = TestCase("t")
    case.result = list(results)
    if out is not None:
        case.system_out = out
    return case


WAIVED = {P.WAIVER_REASON: "vLLM #1", P.WAIVER_LINK: "https://x/1", P.WAIVER_EXPIRES: "2026-12-04",
          P.WAIVER_EXPIRED: "false"}


@pytest.mark.parametrize(("props", "today", "expired"), [
    ({P.WAIVER_EXPIRED: "true"}, None, True),
    (WAIVED, None, False),  # no date to compare: the plugin's own flag decides
    (WAIVED, "2026-12-04", False),  # the last day of a waiver still counts
    (WAIVED, "2026-12-05", True),
    ({**WAIVED, P.WAIVER_EXPIRES: "soon"}, "2026-12-05", False),
    ({P.WAIVER_REASON: "r"}, "2026-12-05", False),
])
def test_a_waiver_expires_after_its_last_day(props, today, expired):
    import datetime

    from quantmatrix.report import read

    day = datetime.date.fromisoformat(today) if today else None
    assert read._waiver_expired(props, day) is expired


def test_outcomes_of_junit_results_and_waivers():
    import datetime

    from junitparser import Error, Failure, Skipped

    from quantmatrix.report import read

    late = datetime.date(2026, 12, 5)
    fail = Failure("boom")
    fail.text = "trace"
    assert read._outcome(_junit(fail, Error("e"), out="log"), {}, None) == ("failed", "boom\ne", "trace\nlog")
    assert read._outcome(_junit(Error("e")), {}, None) == ("error", "e", "")
    assert read._outcome(_junit(Skipped("why")), {}, None) == ("skipped", "why", "")
    assert read._outcome(_junit(Skipped("known", "pytest.xfail")), WAIVED, None) == ("waived", "known", "")
    xpass = Skipped("xfail-marked test passes unexpectedly")
    assert read._outcome(_junit(xpass), {}, None)[0] == "xpassed"
    assert read._outcome(_junit(), {}, None) == ("passed", "", "")
    assert read._outcome(_junit(), WAIVED, None) == ("xpassed", "", "")
    assert read._outcome(_junit(), WAIVED, late) == ("failed", "waiver expired 2026-12-04: vLLM #1 (https://x/1)",
                                                     "")
    assert read._outcome(_junit(Skipped("known", "pytest.xfail")), {**WAIVED, P.WAIVER_LINK: ""}, late) == (
        "failed", "waiver expired 2026-12-04: vLLM #1\nknown", "")
    assert read._outcome(_junit(Error("e")), WAIVED, late)[:2] == (
        "error", "waiver expired 2026-12-04: vLLM #1 (https://x/1)\ne")
    said = Failure("waiver expired on 2026-12-04 (m.yaml:3): vLLM #1")
    assert read._outcome(_junit(said), WAIVED, late)[:2] == ("failed", said.message)
    assert read._outcome(_junit(Skipped("no GPU")), WAIVED, late)[:2] == ("skipped", "no GPU")
    assert read._outcome(_junit(Failure("x" * 5000)), {}, None)[1] == "x" * read.MESSAGE_CHARS


# ------------------------------------------------------------------------------------------- edge cases


def test_a_case_without_history_or_a_missing_night_with_a_version():
    """No `history` key is an empty history; a night the case was missing records no vLLM version even where
    its carried properties still name one."""
    assert _diff(_prev({KEY: {"outcome": "passed", "properties": {}}}), _case("passed")).history == "passed"
    assert _diff(_prev({KEY: _was("missing", vllm_version="0.9")}), _case("passed")).history == "missing"


def test_finish_carries_a_missing_case_after_one_that_has_a_result():
    prev = _prev({KEY: _was("passed", vllm_version="0.11"), OTHER: _was("passed", "failed", arch="sm120")})
    d = Differ(prev, 7)
    cases = {KEY: _case("passed")}
    d.case(cases[KEY])
    d.finish(cases, [_input("sm121")])
    carried = cases[OTHER]
    assert (carried.outcome, carried.own, carried.common, carried.history) == (
        "missing", {P.ARCH: "sm120"}, {}, "passed failed")
    assert carried.entry == (f'{json.dumps(OTHER)}:{{"outcome":"missing","properties":{{"{P.ARCH}":"sm120"}},'
                             '"message":"no result tonight (tested last on n3, not since: red until it runs again, a '
                             'waiver covers it or the matrix drops it)","history":"passed failed","tested":"n3"}')


def test_finish_drops_a_case_missing_without_history():
    cases: dict[str, CaseResult] = {}
    Differ(_prev({KEY: {"outcome": "missing", "properties": {}}}), 7).finish(cases, [_input("sm121")])
    assert cases == {}


def test_lost_archs_are_sorted_naturally():
    out = Differ(None, 7, frozenset({"sm100", "sm90", "sm120"})).finish({}, [_input("sm120")])
    assert out["archs_lost"] == ["sm90", "sm100"]


def test_the_nights_window_names_night_and_date():
    assert Differ(_prev({}, nights=1), 7).nights == [{"night": "n2", "date": "2026-12-02"},
                                                     {"night": "n1", "date": "2026-12-01"}]


def test_load_previous_cuts_long_names_at_100_characters(tmp_path):
    night = {"night": "n" * 150}
    with pytest.raises(ReportError) as e:
        diff.load_previous(_summary(tmp_path, {**GOOD, "nights": [night]}))
    assert str(e.value).endswith(f"nights[0] is not {{night: str, date: str}}: {str(night)[:100]})")
    with pytest.raises(ReportError) as e:
        diff.load_previous(_summary(tmp_path, {**GOOD, "inputs": [{"path": "p" * 150, "common": [],
                                                                    "properties": {}}]}))
    assert str(e.value).endswith(f"input {'p' * 100!r} has malformed common or properties)")


def test_load_previous_of_a_first_night_with_a_case_without_history(tmp_path):
    first = {**GOOD, "nights": [], "cases": {KEY: {"outcome": "passed", "properties": {}}}}
    assert diff.load_previous(_summary(tmp_path, first)).cases[KEY] == {"outcome": "passed", "properties": {}}


def test_load_previous_reads_utf8_whatever_the_locale(tmp_path):
    data = {**GOOD, "cases": {KEY: {"outcome": "passed", "properties": {"label": "café ✓"}}}}
    p = tmp_path / "summary.json"
    p.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    assert diff.load_previous(p).cases[KEY]["properties"] == {"label": "café ✓"}
