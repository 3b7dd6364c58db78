"""The plugin as a user runs it: pytester suites over a small matrix (pytest-xdist acceptance-test style)."""

from __future__ import annotations

import datetime

import junitparser
import pytest
from matrixkit import SMALL, gpu_less_suite

from quantmatrix.host import detect

SUITE = """
def test_cpu_probe(cell, record_property):
    record_property("seen", cell.id)

def test_gpu_probe(cell):
    assert cell.arch.name
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A suite over SMALL on a host whose CUDA queries are faked to find no device (so any host agrees)."""
    return gpu_less_suite(pytester, monkeypatch, SUITE)


def _collected(result: pytest.RunResult) -> list[str]:
    return sorted(line.split("::", 1)[1] for line in result.outlines if "::" in line)


def test_cases_are_cells_times_checks_with_readable_ids(suite):
    """2 checkpoints x 3 archs x 2 modes = 12 cells; cpu_probe takes all, gpu_probe only weight-only ones."""
    result = suite.runpytest("--matrix", "m.yaml", "--collect-only", "-q", "--strict-markers")
    ids = _collected(result)
    assert len(ids) == 12 + 6
    assert "test_cpu_probe[tiny-wo@sm121-nocache]" in ids
    assert "test_gpu_probe[tiny-wo@sm100-default]" in ids
    assert not any(i.startswith("test_gpu_probe[tiny-w4a4") for i in ids)
    assert result.ret == 0


@pytest.mark.parametrize(("expr", "expected"), [
    ("sm120", {"sm120"}),
    ("rtx_pro_6000", {"sm120"}),
    ("gb10 and weight_only", {"sm121"}),
    ("dgx_spark and nocache", {"sm121"}),
    ("not sm100 and gpu", {"sm120", "sm121"}),
])
def test_marker_expressions_select_exactly_their_cells(suite, expr, expected):
    """`-m` on arch names, aliases, scheme, mode and tier selects exactly the matching cases (no `>=` families)."""
    result = suite.runpytest("--matrix", "m.yaml", "--collect-only", "-q", "--strict-markers", "-m", expr)
    ids = _collected(result)
    assert ids, result.outlines
    assert {i.split("@")[1].split("-")[0] for i in ids} == expected
    if "weight_only" in expr:
        assert all("tiny-wo@" in i for i in ids)
    if "nocache" in expr:
        assert all(i.endswith("-nocache]") for i in ids)


def test_gpu_cases_skip_naming_the_arch_and_the_host_with_cuda_queries_faked(suite):
    """With no GPU, every gpu-tier case is skipped with a reason naming the arch it needs and what the host has."""
    result = suite.runpytest("--matrix", "m.yaml", "-rs", "-m", "gpu")
    result.assert_outcomes(skipped=6)
    result.stdout.fnmatch_lines([
        "*needs sm120 (RTX PRO 6000); this host: no CUDA device (faked: no CUDA)*",
        "*needs sm121 (GB10 / DGX Spark); this host: no CUDA device (faked: no CUDA)*",
    ])


def test_strict_hardware_turns_missing_arch_into_failures_with_cuda_queries_faked(suite):
    """A runner that must have the GPU fails, rather than skips, the cases it cannot run."""
    result = suite.runpytest("--matrix", "m.yaml", "-m", "gpu", "--strict-hardware")
    result.assert_outcomes(errors=6)  # raised before any fixture runs on the wrong GPU: a setup error
    result.stdout.fnmatch_lines(["*--strict-hardware: needs sm100 (B200); this host: no CUDA device*"])
    assert result.ret == 1


def test_arch_override_runs_that_arch_and_skips_the_others(suite):
    """--arch gb10 declares the host an sm121: its gpu cases run, sm100/sm120 ones still skip."""
    result = suite.runpytest("--matrix", "m.yaml", "-m", "gpu", "--arch", "gb10", "-rs")
    result.assert_outcomes(passed=2, skipped=4)
    result.stdout.fnmatch_lines(["*needs sm120 (RTX PRO 6000); this host: cuda:0 declared GB10 / DGX Spark "
                                 "[[]sm121 (GB10 / DGX Spark)[]] (via --arch)*"])


def test_real_gpu_detection_matches_exact_family_with_cuda_queries_faked(suite, monkeypatch):
    """A (faked) RTX PRO 6000 at capability 12.0 satisfies sm120 only: not sm100, not sm121."""
    monkeypatch.setattr(detect, "query_torch",
                        lambda: ([detect.Device(0, "NVIDIA RTX PRO 6000 Blackwell", (12, 0))], ""))
    result = suite.runpytest("--matrix", "m.yaml", "-m", "gpu")
    result.assert_outcomes(passed=2, skipped=4)


def test_unknown_arch_override_is_a_usage_error(suite):
    """--arch with a typo names the closest arch and exits as a usage error."""
    result = suite.runpytest("--matrix", "m.yaml", "--arch", "gb1O")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no arch 'gb1O' (did you mean 'gb10'?)*"])


def test_bad_matrix_is_a_usage_error_with_file_and_line(suite):
    """A broken --matrix stops the run with file:line:column and no traceback."""
    suite.makefile(".yaml", bad=SMALL.replace("tier: cpu", "tier: cuda"))
    result = suite.runpytest("--matrix", "bad.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad.yaml:17:45: checks[[]0[]].tier: expected one of cpu, gpu; got 'cuda'*"])
    assert "Traceback" not in result.stderr.str()


def test_test_without_a_matrix_check_fails_collection(suite):
    """A suite function the matrix does not know is an error naming the closest check, never a silent skip."""
    suite.makepyfile(test_other="def test_cpu_prob(cell):\n    pass\n")
    result = suite.runpytest("--matrix", "m.yaml", "test_other.py")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*has no check 'cpu_prob' (did you mean 'cpu_probe'?)*"])


def test_plain_tests_are_untouched_without_a_matrix(pytester):
    """In a checkout with no matrix, the plugin stays out of the way of ordinary tests."""
    pytester.makepyfile("def test_plain():\n    assert True\n")
    pytester.runpytest("--strict-markers").assert_outcomes(passed=1)


def test_default_matrix_is_found_under_the_rootdir(suite):
    """Without --matrix, matrices/default.yaml under the rootdir is the matrix."""
    (suite.path / "matrices").mkdir()
    (suite.path / "matrices" / "default.yaml").write_text(SMALL)
    result = suite.runpytest("--collect-only", "-q", "-m", "sm100 and w4a4")
    assert _collected(result) == ["test_cpu_probe[tiny-w4a4@sm100-default]", "test_cpu_probe[tiny-w4a4@sm100-nocache]"]


def _with_waiver(expires: datetime.date) -> str:
    return SMALL + ("waivers:\n  - match: {checkpoint: tiny-wo, arch: gb10, check: cpu_probe}\n"
                    "    reason: known GB10 zero-expert bug\n    link: https://example.invalid/issue/1\n"
                    f"    expires: {expires}\n")


def test_active_waiver_marks_its_cases_xfail_with_reason_and_link(suite):
    """A waived cell runs as a non-strict xfail that carries the reason, link and expiry."""
    suite.makepyfile(test_suite=SUITE.replace('record_property("seen", cell.id)',
                                              'assert "tiny-wo@sm121" not in cell.id'))
    suite.makefile(".yaml", m=_with_waiver(datetime.date.today() + datetime.timedelta(days=30)))
    result = suite.runpytest("--matrix", "m.yaml", "-m", "cpu", "-rx")
    result.assert_outcomes(passed=10, xfailed=2)
    result.stdout.fnmatch_lines(["*waived until *: known GB10 zero-expert bug (https://example.invalid/issue/1)*"])


def test_expired_waiver_fails_its_cases(suite):
    """After its expiry date a waiver no longer hides anything: its cases fail (in setup) and say why."""
    suite.makefile(".yaml", m=_with_waiver(datetime.date.today() - datetime.timedelta(days=1)))
    result = suite.runpytest("--matrix", "m.yaml", "-m", "cpu")
    result.assert_outcomes(passed=10, errors=2)
    result.stdout.fnmatch_lines(["*waiver expired on * known GB10 zero-expert bug*renew the waiver*"])
    assert result.ret == 1


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_cases_carry_their_cell_and_host_as_junit_properties(suite, workers):
    """Every case's JUnit entry names its cell, axes, check and the vLLM/torch it ran with, also under xdist."""
    import junitparser

    result = suite.runpytest_subprocess("--matrix", str(suite.path / "m.yaml"), "-m", "cpu and sm121",
                                        "--junitxml=out.xml", "-o", "junit_family=xunit1", *workers)
    result.assert_outcomes(passed=4)
    xml = junitparser.JUnitXml.fromfile(str(suite.path / "out.xml"))
    cases = [c for s in xml for c in s]
    assert len(cases) == 4
    for c in cases:
        props = {p.name: p.value for block in c.iterchildren(junitparser.Properties) for p in block}
        assert props["arch"] == "sm121" and props["check"] == "cpu_probe" and props["tier"] == "cpu"
        assert props["cell"] == props["seen"] == f"{props['checkpoint']}@sm121-{props['mode']}"
        assert {"vllm_version", "torch_version", "platform", "runner", "scheme", "producer"} <= set(props)


HOST_CONFTEST = """
from quantmatrix.host.detect import Device, Host

def pytest_quantmatrix_host(config, matrix, arch):
    {body}
"""


def test_a_runners_conftest_answers_host_detection_through_the_hook_with_cuda_queries_faked(suite):
    """A runner's conftest.py that implements pytest_quantmatrix_host replaces detection (here a GB10 it names
    itself, where the faked queries find none): its sm121 gpu cases run, the others skip naming its answer. The
    conftest is docs/runners.md's: an explicit --arch still goes to the chain."""
    suite.makeconftest(HOST_CONFTEST.format(
        body='if arch:\n        return None\n'
             '    return Host((Device(0, "NVIDIA GB10", matrix.arch("gb10").capability),), "runner conftest")'))
    result = suite.runpytest("--matrix", "m.yaml", "-m", "gpu", "-rs")
    result.assert_outcomes(passed=2, skipped=4)
    result.stdout.fnmatch_lines([
        "quantmatrix: host cuda:0 NVIDIA GB10 [[]sm121 (GB10 / DGX Spark)[]] (via runner conftest)*",
        "*needs sm120 (RTX PRO 6000); this host: cuda:0 NVIDIA GB10 [[]sm121 (GB10 / DGX Spark)[]] "
        "(via runner conftest)*"])
    result = suite.runpytest("--matrix", "m.yaml", "-m", "gpu", "--arch", "rtx_pro_6000", "-v")
    result.assert_outcomes(passed=2, skipped=4)
    assert all("@sm120-" in line for line in result.outlines if "PASSED" in line)


def test_a_conftest_that_answers_none_leaves_detection_to_the_chain_with_cuda_queries_faked(suite):
    """None from the hook is no answer: --arch, QUANTMATRIX_ARCH, nvidia-smi and torch.cuda still decide."""
    suite.makeconftest(HOST_CONFTEST.format(body="return None"))
    result = suite.runpytest("--matrix", "m.yaml", "-m", "gpu", "-rs")
    result.assert_outcomes(skipped=6)
    result.stdout.fnmatch_lines(["*needs sm121 (GB10 / DGX Spark); this host: no CUDA device (faked: no CUDA)*"])
    result = suite.runpytest("--matrix", "m.yaml", "-m", "gpu", "--arch", "gb10")
    result.assert_outcomes(passed=2, skipped=4)


def test_a_conftest_that_answers_something_else_is_a_usage_error(suite):
    suite.makeconftest(HOST_CONFTEST.format(body='return "sm121"'))
    result = suite.runpytest("--matrix", "m.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*pytest_quantmatrix_host answered 'sm121', not a quantmatrix.host.detect.Host*"])


def _waived(expires: datetime.date) -> str:
    """SMALL with a waiver of every check of tiny-wo on gb10."""
    return SMALL + ("waivers:\n  - match: {checkpoint: tiny-wo, arch: gb10}\n    reason: known GB10 zero-expert bug\n"
                    f"    link: https://example.invalid/issue/1\n    expires: {expires}\n")


def test_the_gates_answer_in_order_expired_waiver_before_absent_gpu(suite):
    """A gpu case whose waiver expired, on a host without its GPU under --strict-hardware: the expired waiver
    is what the case says (the earlier gate), the other gpu cases the missing GPU."""
    suite.makefile(".yaml", m=_waived(datetime.date.today() - datetime.timedelta(days=1)))
    result = suite.runpytest("--matrix", "m.yaml", "-m", "gpu", "--strict-hardware", "--junitxml=out.xml")
    result.assert_outcomes(errors=6)
    messages = {c.name: c.result[0].message for c in _cases(suite.path / "out.xml")}
    waiver = {name for name, m in messages.items() if "waiver expired on" in m}
    assert waiver == {"test_gpu_probe[tiny-wo@sm121-default]", "test_gpu_probe[tiny-wo@sm121-nocache]"}
    assert not any("--strict-hardware" in messages[name] for name in waiver)
    assert all("--strict-hardware: needs " in m for name, m in messages.items() if name not in waiver)


def _cases(path):
    return [c for s in junitparser.JUnitXml.fromfile(str(path)) for c in s]


def test_a_passed_time_limit_comes_before_every_other_gate_and_the_case_keeps_its_cell(suite):
    """Past the time limit nothing else is asked: an expired waiver or a missing GPU are "not run" like the rest
    (no failure invented by a case that never started), and each case still carries its cell in JUnit."""
    suite.makefile(".yaml", m=_waived(datetime.date.today() - datetime.timedelta(days=1)))
    result = suite.runpytest("--matrix", "m.yaml", "--strict-hardware", "--time-limit", "0.000001",
                             "--junitxml=out.xml", "-o", "junit_family=xunit1")
    result.assert_outcomes(skipped=18)
    cases = _cases(suite.path / "out.xml")
    assert len(cases) == 18
    for c in cases:
        assert c.result[0].message.startswith("not run: the time limit of 1e-06 s for this run (--time-limit)")
        props = {p.name: p.value for block in c.iterchildren(junitparser.Properties) for p in block}
        assert props["cell"] in c.name
