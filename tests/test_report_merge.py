"""Merging real JUnit files: properties under xdist and xunit families, outcomes, reruns, bad input."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from quantmatrix import properties as P
from quantmatrix.cli import main
from quantmatrix.errors import ReportError
from quantmatrix.pytest_plugin.junit import stamp_testsuite_properties
from quantmatrix.report import render_md
from quantmatrix.report.build import build, summary_json
from quantmatrix.report.model import RED
from quantmatrix.report.write import write

if TYPE_CHECKING:
    from conftest import SuiteRunner

CELLS = ["qwen3moe-tiny-nvfp4-weight-only@sm121-nocache", "qwen3moe-tiny-nvfp4-weight-only@sm120-default",
         "mixtral-tiny-nvfp4-w4a4@sm121-eager", "mixtral-tiny-nvfp4-w4a4@sm100-default"]
PLUGIN_PROPS = P.CELL_PROPERTIES | {P.VLLM_VERSION, P.TORCH_VERSION, P.PLATFORM, P.DEVICE_NAME, P.DEVICE_CAPABILITY,
                                    P.RUNNER}
CHECK_PROPS = {P.QUANT_METHOD, P.MOE_BACKEND, "metric.max_abs_err", "time.load"}
HOST_PROPS = {P.VLLM_VERSION, P.TORCH_VERSION, P.RUNNER, P.HOST_ARCH, P.DEVICE_NAME, P.MATRIX, P.RUN_ID}


def report_of(*paths: Path, **kw):
    import datetime

    date = kw.pop("date", datetime.date(2026, 12, 2))
    return build([str(p) for p in paths], None, night="n1", date=date, **kw)


@pytest.mark.parametrize("xdist", [False, True], ids=["serial", "xdist-n2"])
def test_case_and_suite_properties_survive_with_and_without_xdist(junit_suite: SuiteRunner,
                                                                   xdist: bool) -> None:
    """Per-case properties (item.user_properties + record_property) and stamped suite properties are in the
    real file pytest writes under xunit1, serially and with `-n 2`, and the cases really ran on workers."""
    result = junit_suite.run("props", CELLS, checks=("config_dispatch", "weight_audit"), xdist=xdist)
    result.assert_outcomes(passed=8)
    report = report_of(junit_suite.last)
    assert len(report.cases) == 8
    for c in report.cases.values():
        assert PLUGIN_PROPS | CHECK_PROPS <= c.props.keys(), c.key
        assert c.props["cell"] == c.key.split("[", 1)[1].rstrip("]")
        assert c.props["check"] == c.key.split("::test_")[1].split("[")[0]
    workers = {c.props["worker"] for c in report.cases.values()}
    assert (workers <= {"gw0", "gw1"}) if xdist else workers == {"main"}
    (inp,) = report.inputs
    assert HOST_PROPS <= inp.properties.keys()
    assert inp.properties[P.RUN_ID] == "props"
    case = report.cases["test_suite::test_config_dispatch[qwen3moe-tiny-nvfp4-weight-only@sm121-nocache]"]
    assert case.axes == ("qwen3moe-tiny-nvfp4-weight-only", "sm121", "nocache", "config_dispatch",
                         "nvfp4_weight_only")
    assert case.props[P.DEVICE_NAME] == "NVIDIA GB10"


def test_a_layout_other_than_the_serving_one_is_its_own_row(junit_suite: SuiteRunner, tmp_path: Path) -> None:
    """The plugin's `layout` property and a cell id ending in it put a tp2 case on its own grid row, beside the
    checkpoint's serving row, in matrix.md."""
    cells = ["mixtral-tiny-nvfp4-w4a4@sm100-default", "mixtral-tiny-nvfp4-w4a4@sm100-default-tp2"]
    junit_suite.run("layouts", cells, outcomes={"config_dispatch[mixtral-tiny-nvfp4-w4a4@sm100-default-tp2]": "fail"})
    report = report_of(junit_suite.last)
    serving, tp2 = (report.cases[f"test_suite::test_config_dispatch[{c}]"] for c in cells)
    assert (serving.props[P.LAYOUT], tp2.props[P.LAYOUT]) == ("tp1", "tp2")
    assert serving.axes[:3] == ("mixtral-tiny-nvfp4-w4a4", "sm100", "default")
    assert tp2.axes[:3] == ("mixtral-tiny-nvfp4-w4a4 [tp2]", "sm100", "default")
    write(report, tmp_path / "out")
    rows = [r for r in (tmp_path / "out" / "matrix.md").read_text().splitlines() if r.startswith("| mixtral")]
    assert [r.split(" | ")[0] for r in rows] == ["| mixtral-tiny-nvfp4-w4a4", r"| mixtral-tiny-nvfp4-w4a4 \[tp2\]"]
    assert "❌" in rows[1] and "❌" not in rows[0]


def test_record_testsuite_property_is_lost_under_xdist_but_stamping_is_not(junit_suite: SuiteRunner) -> None:
    """pytest's caveat is real: record_testsuite_property writes nothing under -n 2, which is why suite
    properties are stamped into the finished file by the controller instead."""
    extra = '''

def test_suite_prop(record_testsuite_property):
    record_testsuite_property("via_fixture", "yes")
'''
    junit_suite.run("serial", CELLS[:1], extra_test=extra)
    serial = report_of(junit_suite.last).inputs[0].properties
    junit_suite.run("xdist", CELLS[:1], extra_test=extra, xdist=True)
    xdist = report_of(junit_suite.last).inputs[0].properties
    assert serial["via_fixture"] == "yes"
    assert "via_fixture" not in xdist
    assert HOST_PROPS <= serial.keys() and HOST_PROPS <= xdist.keys()


def test_xunit2_warns_about_record_property_so_the_project_uses_xunit1(junit_suite: SuiteRunner) -> None:
    """Under xunit2 pytest flags record_property as incompatible (its per-case <properties> break the
    schema); under xunit1 it does not, and the report reads per-case properties either way."""
    warned = junit_suite.run("x2", CELLS[:1], family="xunit2")
    assert "record_property is incompatible with junit_family 'xunit2'" in warned.stdout.str()
    assert CHECK_PROPS <= next(iter(report_of(junit_suite.last).cases.values())).props.keys()
    clean = junit_suite.run("x1", CELLS[:1], family="xunit1")
    assert "incompatible with junit_family" not in clean.stdout.str()


def test_outcomes_waivers_messages_and_log_tails(junit_suite: SuiteRunner) -> None:
    """pytest's results map to passed/failed/error/skipped/waived/xpassed; an expired waiver (flagged by the
    plugin, or past its date) is a failure; a failure keeps its message and the tail of its log."""
    behaviours = ["pass", "fail", "error", "skip", "waive", "xpass", "expired", "stale"]
    cells = [f"ck{i}@sm121-default" for i in range(len(behaviours))]
    outcomes = {f"config_dispatch[{c}]": b for c, b in zip(cells, behaviours, strict=True)}
    junit_suite.run("outcomes", cells, outcomes=outcomes, args=["-o", "junit_logging=system-out"])
    report = report_of(junit_suite.last)
    got = {c.checkpoint: c for c in report.cases.values()}
    assert [got[f"ck{i}"].outcome for i in range(len(behaviours))] == [
        "passed", "failed", "error", "skipped", "waived", "xpassed", "failed", "failed"]
    fail, error, skip, waived = got["ck1"], got["ck2"], got["ck3"], got["ck4"]
    assert "config_dispatch broke on ck1@sm121-default" in fail.message
    assert "engine step 59 on ck1@sm121-default" in fail.log_tail
    assert "engine step 10 " not in fail.log_tail  # a tail, not the whole log
    assert "out of GPU memory" in error.message
    assert skip.message == "needs 2 GPUs"
    assert waived.message == "FlashInfer MoE NaN on GB10"
    assert waived.props[P.WAIVER_LINK] == "https://github.com/example/qm/issues/7"
    assert got["ck6"].message.startswith("waiver expired 2020-01-01: FlashInfer MoE NaN on GB10")
    assert got["ck7"].message.startswith("waiver expired 2020-01-01")


def test_call_failure_and_teardown_error_in_one_file_are_one_case(junit_suite: SuiteRunner) -> None:
    """pytest writes a call failure plus a teardown error as two <testcase>s; they fold into one red case
    carrying both messages, not into a fake rerun."""
    cell = CELLS[0]
    junit_suite.run("teardown", [cell], outcomes={f"config_dispatch[{cell}]": "teardown_error"})
    assert junit_suite.last.read_text().count("<testcase ") == 2
    report = report_of(junit_suite.last)
    (case,) = report.cases.values()
    assert case.outcome in RED
    assert "broke on" in case.message and "engine shutdown hung" in case.message
    assert case.attempts == () and "flaky" not in case.tags


def test_rerun_in_a_second_file_folds_with_its_history(junit_suite: SuiteRunner) -> None:
    """A case failing in the nightly file and passing in the later rerun file is one passed case with both
    attempts, flagged flaky, whatever order the files are given in."""
    key = f"config_dispatch[{CELLS[0]}]"
    junit_suite.run("first", CELLS[:2], outcomes={key: "fail"})
    first = junit_suite.last
    junit_suite.run("rerun", CELLS[:1])
    rerun = junit_suite.last
    for order in ((first, rerun), (rerun, first)):
        report = report_of(*order)
        assert len(report.cases) == 2
        case = report.cases[f"test_suite::test_{key}"]
        assert case.outcome == "passed"
        assert case.attempts == ("failed", "passed")
        assert report.diff["flaky"] == [case.key]


def test_bad_files_are_named_and_skipped_and_the_rest_is_merged(junit_suite: SuiteRunner, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Empty, truncated, non-JUnit and binary files and a run dir without XML are each named with the reason
    in summary.json, matrix.md, index.html and on stderr; the good file is still merged; the command exits 2
    unless --allow-bad-inputs accepts a partial night."""
    junit_suite.run("good", CELLS)
    runs = tmp_path / "runs"
    (runs / "sm121").mkdir(parents=True)
    (runs / "empty-dir").mkdir()
    shutil.copy(junit_suite.last, runs / "sm121" / "good.xml")
    (runs / "sm121" / "empty.xml").write_bytes(b"")
    text = junit_suite.last.read_text()
    (runs / "sm121" / "truncated.xml").write_text(text[: len(text) // 2])
    (runs / "sm121" / "html.xml").write_text("<html><body>502 Bad Gateway</body></html>")
    (runs / "sm121" / "binary.xml").write_bytes(os.urandom(256))
    out = tmp_path / "out"
    argv = ["report", str(runs / "sm121"), str(runs / "empty-dir"), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    for name in ("empty.xml", "truncated.xml", "html.xml", "binary.xml", "empty-dir"):
        assert f"bad input {runs}" in err and name in err
    # 0 with --allow-bad-inputs: without a previous night nothing is known to be lost (with one, the unreadable
    # file's cases would be missing, a coverage loss, and the exit code 1).
    assert main([*argv, "--allow-bad-inputs"]) == 0
    data = json.loads((out / "summary.json").read_text())
    problems = {Path(b["path"]).name: b["problem"] for b in data["bad_inputs"]}
    assert problems["empty.xml"] == "empty file"
    assert problems["truncated.xml"].startswith("not well-formed XML (truncated?)")
    assert problems["html.xml"].startswith("not a JUnit file")
    assert problems["binary.xml"].startswith("not well-formed XML")
    assert problems["empty-dir"] == "run directory holds no *.xml file"
    assert len(data["cases"]) == len(CELLS)
    md, html = (out / "matrix.md").read_text(), (out / "index.html").read_text()
    for name in problems:
        assert name in md and name in html
    assert "(5 bad)" in capsys.readouterr().out


def test_outputs_are_replaced_atomically_with_normal_permissions(junit_suite: SuiteRunner,
                                                                  tmp_path: Path) -> None:
    """Each output is written to a temp file in the same dir and renamed over the old one (new inode, no
    temp left behind, no half file); permissions are what a plain write would give, not mkstemp's 0600."""
    junit_suite.run("n", CELLS)
    out = tmp_path / "out"
    old_umask = os.umask(0o022)
    try:
        main(["report", str(junit_suite.last), "--out", str(out)])
        before = {p.name: p.stat().st_ino for p in out.iterdir()}
        main(["report", str(junit_suite.last), "--out", str(out)])
    finally:
        os.umask(old_umask)
    after = {p.name: p.stat() for p in out.iterdir()}
    assert sorted(after) == ["index.html", "matrix.md", "summary.json"]
    for name, st in after.items():
        assert st.st_ino != before[name], name
        assert stat.S_IMODE(st.st_mode) == 0o644, name


def test_stamp_is_atomic_idempotent_and_keeps_the_cases(junit_suite: SuiteRunner) -> None:
    """Stamping twice updates a value instead of adding a second property, goes through a rename, and
    leaves every case and its properties as pytest wrote them; an unreadable file is a clear error."""
    junit_suite.run("n", CELLS)
    xml = junit_suite.last
    before = report_of(xml)
    inode = xml.stat().st_ino
    stamp_testsuite_properties(xml, {"run_id": "again", "extra": "1"})
    assert xml.stat().st_ino != inode
    assert xml.read_text().count('name="run_id"') == 1
    after = report_of(xml)
    assert after.inputs[0].properties[P.RUN_ID] == "again" and after.inputs[0].properties["extra"] == "1"
    assert {k: (c.outcome, c.props) for k, c in after.cases.items()} == \
        {k: (c.outcome, c.props) for k, c in before.cases.items()}
    bad = xml.with_name("bad.xml")
    bad.write_text("<testsuites><testsuite>")
    with pytest.raises(Exception, match="bad.xml: cannot stamp suite properties"):
        stamp_testsuite_properties(bad, {"a": "b"})


def test_parallel_parsing_gives_the_same_summary_as_serial(junit_suite: SuiteRunner, tmp_path: Path) -> None:
    """Worker processes (used for many files) produce exactly the model a single process does."""
    junit_suite.run("a", CELLS, checks=("config_dispatch", "weight_audit"),
                    outcomes={f"weight_audit[{CELLS[1]}]": "fail", f"config_dispatch[{CELLS[2]}]": "skip"})
    files = []
    for i in range(40):
        files.append(tmp_path / f"copy{i:02d}.xml")
        text = junit_suite.last.read_text().replace('classname="test_suite"', f'classname="copy{i:02d}"')
        files[-1].write_text(text)
    serial, parallel = report_of(*files, jobs=1), report_of(*files, jobs=2)
    assert len(serial.cases) == 40 * 8
    assert summary_json(serial) == summary_json(parallel)


def test_outputs_written_beside_the_page_are_the_serial_bytes(junit_suite: SuiteRunner, tmp_path: Path) -> None:
    """With jobs > 1 summary.json and matrix.md come from a forked child while the page renders: the
    three files are byte for byte what one process writes."""
    junit_suite.run("a", CELLS, outcomes={f"config_dispatch[{CELLS[1]}]": "fail"})
    report = report_of(junit_suite.last)
    write(report, tmp_path / "serial", jobs=1)
    write(report, tmp_path / "forked", jobs=2)
    for name in ("summary.json", "matrix.md", "index.html"):
        assert (tmp_path / "forked" / name).read_bytes() == (tmp_path / "serial" / name).read_bytes(), name


def test_a_failure_in_the_writer_child_is_an_error_not_a_silent_gap(junit_suite: SuiteRunner, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """If the forked child dies, the parent says which outputs it was writing instead of returning paths
    to files that were never written."""
    junit_suite.run("a", CELLS)
    report = report_of(junit_suite.last)

    def broken(*args: object) -> str:
        raise RuntimeError("render exploded")

    monkeypatch.setattr(render_md, "render", broken)
    with pytest.raises(ReportError, match=r"writing summary.json and matrix.md failed in a child process "
                                          r"\(exit code 1\)"):
        write(report, tmp_path / "out", jobs=2)
    assert not (tmp_path / "out" / "matrix.md").exists()


def test_cases_without_plugin_properties_are_placed_by_their_name(pytester: pytest.Pytester) -> None:
    """A plain pytest file (no quantmatrix properties) still lands in the right grid cell, parsed from
    `test_<check>[<checkpoint>@<arch>-<mode>]` (a layout other than the serving one, `-<layout>` at the end, gets
    its own row); unknown shapes go to a '(none)' cell instead of crashing."""
    pytester.makepyfile(test_plain='''
import pytest

@pytest.mark.parametrize("cell", ["gpt-oss-tiny@sm90-poison_zero", "weird", "gpt-oss-tiny@sm90-default-tp2_ep"])
def test_lint(cell):
    pass
''')
    xml = pytester.path / "plain.xml"
    pytester.runpytest("-p", "no:quantmatrix", f"--junitxml={xml}", "-o", "junit_family=xunit1")
    axes = sorted(c.axes for c in report_of(xml).cases.values())
    assert axes == [("(none)", "(none)", "(none)", "lint", ""),
                    ("gpt-oss-tiny", "sm90", "poison_zero", "lint", ""),
                    ("gpt-oss-tiny [tp2_ep]", "sm90", "default", "lint", "")]


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required"),
    (["nowhere", "--out", "o"], "nowhere: no such file or directory"),
    (["{xml}", "--out", "o", "--date", "02/12/2026"], "--date: expected YYYY-MM-DD"),
    (["{xml}", "--out", "o", "--history", "0"], "--history must be at least 1"),
    (["{xml}", "--out", "o", "--previous", "{xml}"], "previous summary is not valid JSON"),
    (["{xml}", "--out", "o", "--previous", "missing.json"], "cannot read previous summary"),
])
def test_usage_errors_exit_2_with_a_message(junit_suite: SuiteRunner, capsys: pytest.CaptureFixture[str],
                                            argv: list[str], message: str) -> None:
    """A wrong command line exits 2 and says what is wrong, never a traceback; nothing is written."""
    junit_suite.run("n", CELLS[:1])  # pytester runs the test in its own directory: "o" lands there
    assert main(["report", *(a.format(xml=junit_suite.last) for a in argv)]) == 2
    assert message in capsys.readouterr().err
    assert not Path("o").exists()
