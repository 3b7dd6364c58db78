"""A broken vLLM under test is one shared red line, found once and fast: every case needing the broken part fails
at once with the same message, the cases that need no vLLM still run, and JUnit, the terminal and the report
carry one `vllm_health` record.

The broken vLLMs are fakes on PYTHONPATH: a package whose every `vllm.*` module is synthesised empty, except that,
per FAKE_VLLM, its quantization package raises the error the issue saw, its config import hangs or segfaults, or
only its layer-side import fails. Each import of the package appends a line to FAKE_VLLM_LOG, which counts the
imports. Inline runs pass --vllm-health-child (only the health child, a subprocess, sees the fake); the check in
the process that runs the cases (the default) is shown by subprocess runs, where the fake is on the path."""

from __future__ import annotations

import json
import os
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from quantmatrix import cli
from quantmatrix import properties as P
from quantmatrix.adapter import health

FAKE_INIT = '''
import ctypes, importlib.abc, importlib.machinery, os, sys, time

MODE = os.environ.get("FAKE_VLLM", "ok")
if os.environ.get("FAKE_VLLM_LOG"):
    with open(os.environ["FAKE_VLLM_LOG"], "a") as log:
        log.write("imported\\n")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        if name == "vllm.config" and MODE == "hang":
            time.sleep(3600)
        if name == "vllm.config" and MODE == "segfault":
            ctypes.string_at(0)
        if name == "vllm.model_executor.layers.quantization":
            if MODE == "quant_raises":
                raise AttributeError("module 'cuda.bindings.runtime' has no attribute 'cudaLibrary_t'")
            module.get_quantization_config = lambda method: object
        if name == "vllm.distributed" and MODE == "layers_broken":
            raise ImportError("libfake_nccl.so: cannot open shared object file")


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith("vllm."):
            return importlib.machinery.ModuleSpec(name, _Loader(), is_package=True)
        return None


sys.meta_path.insert(0, _Finder())
'''

MATRIX = """\
version: 1
archs:
  - {name: sm120, capability: "12.0", aliases: [rtx_pro_6000], label: RTX PRO 6000}
  - {name: sm121, capability: "12.1", aliases: [gb10], label: GB10}
modes:
  - {name: default, label: caching allocator}
  - {name: eager, label: eager, engine_args: {enforce_eager: true}}
schemes:
  - {name: bf16, marker: bf16, label: bf16, expect: {quant_method: none, resolves_to: unquantized}}
checks:
  - {name: resolves, kind: dispatch, tier: cpu, vllm: [config], description: needs config resolution}
  - {name: builds, kind: dispatch, tier: cpu, vllm: [config, layers], description: needs the layer classes}
  - {name: reads_files, kind: lint, tier: cpu, description: needs no vLLM}
checkpoints:
  - {id: ck-a, source: {path: ck}, producer: none, scheme: bf16}
  - {id: ck-b, source: {path: ck}, producer: none, scheme: bf16}
"""
# What each check does once it is let through: nothing that imports vLLM (the fakes have no real API).
CHECKS = """
def test_resolves(case):
    pass


def test_builds(case):
    pass


def test_reads_files(case):
    pass
"""
CELLS = 2 * 2 * 2  # checkpoints x archs x modes, per check
SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def fake_vllm(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A project with the three checks, and a function that installs a fake vLLM of the given kind."""
    site = tmp_path / "fake-site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text(FAKE_INIT)
    log = tmp_path / "imports.log"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(SRC)]))  # this checkout in the subprocesses
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path / "cache"))
    (pytester.path / "ck").mkdir()
    pytester.makefile(".yaml", m=MATRIX)
    pytester.makepyfile(test_checks=CHECKS)

    def install(kind: str) -> Path:
        monkeypatch.setenv("FAKE_VLLM", kind)
        return log

    return pytester, install


def _cells() -> list[str]:
    return [f"{ck}@{arch}-{mode}" for ck in ("ck-a", "ck-b") for arch in ("sm120", "sm121")
            for mode in ("default", "eager")]


def _children(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _errors(pytester: pytest.Pytester) -> dict[str, str]:
    """Each errored case's message, from the JUnit file (the terminal cuts long lines)."""
    root = ET.parse(pytester.path / "j.xml").getroot()
    return {f"{tc.get('name')}": e.get("message", "") for tc in root.iter("testcase") for e in tc.iter("error")}


def _run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, float]:
    start = time.monotonic()
    result = pytester.runpytest("--matrix", "m.yaml", "-p", "no:cacheprovider", "--junitxml=j.xml",
                                "--vllm-health-child", *args)
    return result, time.monotonic() - start


def test_a_quantization_import_error_fails_every_vllm_case_at_once_with_one_message(fake_vllm):
    """The issue's install: vLLM's quantization package raises at import. One child, a few seconds; every
    vLLM-needing case errors with the same message naming the failing import; the no-vLLM check passes;
    one vllm_health record in the terminal and in the JUnit testsuite properties."""
    pytester, install = fake_vllm
    log = install("quant_raises")
    result, seconds = _run(pytester)
    assert seconds < 15, f"a broken vLLM took {seconds:.1f} s to report"
    result.assert_outcomes(passed=CELLS, errors=2 * CELLS)
    assert _children(log) == 1
    messages = set(_errors(pytester).values())
    assert len(messages) == 2  # config's cause, and the layer cases' (config and layers)
    assert all("vLLM under test broken, not tested: config (import vllm.model_executor.layers.quantization" in m
               and "AttributeError: module 'cuda.bindings.runtime' has no attribute 'cudaLibrary_t'" in m
               for m in messages)
    records = [line for line in result.outlines if line.startswith("quantmatrix: vllm_health:")]
    assert len(records) == 1 and records[0].startswith("quantmatrix: vllm_health: broken: config (")
    xml = (pytester.path / "j.xml").read_text()
    assert xml.count(f'<property name="{P.VLLM_HEALTH}" value="{P.HEALTH_BROKEN}: config') == 1
    assert xml.count(f'<property name="{P.NOT_TESTED}" value="{P.VLLM_BROKEN}"') == 2 * CELLS


def test_a_partly_working_vllm_fails_only_the_checks_that_need_the_broken_part(fake_vllm):
    """Config resolution imports, the layer side does not: the config-only check passes, the layer check
    fails naming vllm.distributed, the no-vLLM check passes."""
    pytester, install = fake_vllm
    install("layers_broken")
    result, _ = _run(pytester)
    result.assert_outcomes(passed=2 * CELLS, errors=CELLS)
    errors = _errors(pytester)
    assert sorted(errors) == sorted(f"test_builds[{c}]" for c in _cells())
    assert {m.split(" [")[0] for m in errors.values()} == {
        "failed on setup with \"Failed: vLLM under test broken, not tested: layers (import vllm.distributed: "
        "ImportError: libfake_nccl.so: cannot open shared object file)"}


def test_an_import_that_hangs_is_cut_at_the_time_limit_and_named(fake_vllm):
    """`import vllm.config` never returns: the child is stopped at --vllm-health-timeout, the cause names
    the module and the hang, and the session goes on (the no-vLLM cases pass)."""
    pytester, install = fake_vllm
    install("hang")
    result, seconds = _run(pytester, "--vllm-health-timeout", "3")
    assert seconds < 15
    result.assert_outcomes(passed=CELLS, errors=2 * CELLS)
    assert all("vLLM under test broken, not tested: config (vllm.config: hung: no answer within 3 s)" in m
               for m in _errors(pytester).values())


def test_an_import_that_segfaults_is_named_with_the_signal(fake_vllm):
    """The child dies of SIGSEGV inside `import vllm.config`: config is named with the signal, and the parts
    after it (which in this fake never import vllm.config) are checked in one fresh child; no case retries."""
    pytester, install = fake_vllm
    log = install("segfault")
    result, seconds = _run(pytester)
    assert seconds < 15
    result.assert_outcomes(passed=CELLS, errors=2 * CELLS)
    assert all("vLLM under test broken, not tested: config (vllm.config: crashed the process (signal 11: SIGSEGV))"
               in m for m in _errors(pytester).values())
    assert _children(log) == 2
    assert "vllm_health: broken: config (vllm.config: crashed the process (signal 11: SIGSEGV))" in result.stdout.str()


def _run_here(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """A subprocess session that checks in the process running the cases (the fake vLLM is on its path)."""
    return pytester.runpytest_subprocess("--matrix", "m.yaml", "-p", "no:cacheprovider", "--junitxml=j.xml", *args)


def test_where_the_session_runs_its_cases_the_check_imports_vllm_there_once(fake_vllm):
    """No child: the one import of vLLM is this process's own (a cold start pays for it once, not twice), and a
    raising import is still one shared message on every vLLM case."""
    pytester, install = fake_vllm
    log = install("quant_raises")
    _run_here(pytester).assert_outcomes(passed=CELLS, errors=2 * CELLS)
    assert _children(log) == 1
    assert all("vLLM under test broken, not tested: config (import vllm.model_executor.layers.quantization" in m
               for m in _errors(pytester).values())


def test_a_hang_in_the_sessions_own_check_is_cut_at_the_time_limit_with_its_frames(fake_vllm):
    """The import runs in a thread of its own: at --vllm-health-timeout the session names the hang and the frame
    it hangs in, and goes on."""
    pytester, install = fake_vllm
    install("hang")
    result = _run_here(pytester, "--vllm-health-timeout", "1")
    result.assert_outcomes(passed=CELLS, errors=2 * CELLS)
    assert all("config (vllm.config: hung: no answer within 1 s)" in m for m in _errors(pytester).values())
    result.stdout.fnmatch_lines(["*config: last frames:*", "*in exec_module"])


def test_a_crash_in_the_sessions_own_check_sends_every_later_session_to_the_child(fake_vllm):
    """An import that kills the interpreter takes the first session with it (faulthandler names the frame); the
    marker it left sends the next session under this environment to the child, which survives the crash and
    names it: one shared cause from then on."""
    pytester, install = fake_vllm
    log = install("segfault")
    crashed = _run_here(pytester)
    assert crashed.ret != 0 and "Segmentation fault" in crashed.stderr.str()
    assert len(list(Path(os.environ["QUANTMATRIX_CACHE"], "health").glob("*.here.*"))) == 1
    _run_here(pytester).assert_outcomes(passed=CELLS, errors=2 * CELLS)
    assert all("config (vllm.config: crashed the process (signal 11: SIGSEGV))" in m
               for m in _errors(pytester).values())
    assert _children(log) == 1 + 2  # the crashed session's own import, then the child and a fresh one after it


def test_under_xdist_the_controller_checks_once_and_every_worker_uses_its_result(fake_vllm):
    """-n 2: one health child in all (the controller's), and the workers fail their cases with its message."""
    pytester, install = fake_vllm
    log = install("quant_raises")
    result = pytester.runpytest_subprocess("--matrix", "m.yaml", "-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=CELLS, errors=2 * CELLS)
    assert _children(log) == 1


def test_detect_prints_the_health_verdict_and_exits_1_when_broken(fake_vllm, capsys):
    """`quantmatrix detect` runs the same check: the record, the last frames, exit 1."""
    pytester, install = fake_vllm
    install("quant_raises")
    rc = cli.main(["detect", "--matrix", str(pytester.path / "m.yaml"), "--arch", "sm121"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "vllm_health: broken: config (import vllm.model_executor.layers.quantization" in out
    assert "config: last frames:" in out


def test_detect_cuts_a_hanging_import_at_its_vllm_health_timeout(fake_vllm, capsys):
    """`quantmatrix detect --vllm-health-timeout 2` hands the plugin's flag to the same check: the hang is named
    with that limit, exit 1."""
    pytester, install = fake_vllm
    install("hang")
    start = time.monotonic()
    rc = cli.main(["detect", "--matrix", str(pytester.path / "m.yaml"), "--arch", "sm121",
                   "--vllm-health-timeout", "2"])
    assert rc == 1 and time.monotonic() - start < 15
    assert "broken: config (vllm.config: hung: no answer within 2 s)" in capsys.readouterr().out


def test_a_working_vllm_is_checked_once_per_environment_and_then_read_from_the_cache(fake_vllm):
    """A fake vLLM that imports cleanly: the first session runs the child, the second reads the cached ok
    result of the same environment; every case passes."""
    pytester, install = fake_vllm
    log = install("ok")
    for _ in range(2):
        result, _ = _run(pytester)
        result.assert_outcomes(passed=3 * CELLS)
    assert _children(log) == 1
    result.stdout.fnmatch_lines(["quantmatrix: vllm_health: ok (config, layers, engine imported in *"])


def test_health_record_round_trips_through_json_for_the_workers():
    """What the controller hands the workers is what it found."""
    h = health.Health({"config": health.Part(True), "layers": health.Part(False, "boom", "import x", ("a:1",))},
                      {"vllm": "0.32.0"}, 1.5)
    back = health.Health.from_json(h.to_json())
    assert back == h
    assert back.message(["config"]) is None
    assert back.message(["config", "layers"]) == "vLLM under test broken, not tested: layers (import x: boom) " \
                                                 "[vllm 0.32.0]"


def test_the_report_shows_one_broken_line_and_counts_those_cases_as_not_tested(fake_vllm, tmp_path):
    """`quantmatrix report` over the broken night's JUnit: one "vLLM under test broken on ..." line above the
    grid in matrix.md and index.html's data, and the 16 cases counted as not tested, apart from failures."""
    pytester, install = fake_vllm
    install("quant_raises")
    _run(pytester)
    out = tmp_path / "report"
    assert cli.main(["report", str(pytester.path / "j.xml"), "--out", str(out)]) == 1
    md = (out / "matrix.md").read_text()
    lines = [ln for ln in md.splitlines() if "vLLM under test broken on" in ln]
    assert len(lines) == 1 and md.index(lines[0]) < md.index("## Matrix")
    assert "on a host without a GPU" in lines[0] and "cudaLibrary" in lines[0]
    totals = json.loads((out / "summary.json").read_text())["totals"]
    assert totals["not tested (vLLM broken)"] == 2 * CELLS and totals["error"] == 0 and totals["passed"] == CELLS
    assert "vLLM under test broken on a host without a GPU" in (out / "index.html").read_text()


IMPORTS_VLLM = """
import importlib


def test_resolves(case):
    importlib.import_module("vllm.model_executor.layers.quantization")


def test_builds(case):
    importlib.import_module("vllm.model_executor.layers.quantization")


def test_reads_files(case):
    pass
"""


def test_a_stale_cached_ok_is_dropped_at_the_first_unpredicted_import_error_and_the_rest_fails_fast(fake_vllm):
    """A session records vLLM as working; then the quantization import breaks in a way the cache key cannot see
    (here an environment variable; on a runner a native library replaced in place or a driver change). The next
    session starts from the cached "ok", so its first vLLM case meets the import error itself; that drops the
    cached verdict and checks again, and every later vLLM case fails at once with the one shared cause, each
    counted "not tested"; the no-vLLM check still passes. Runs as subprocesses: the cases import the fake vLLM."""
    pytester, install = fake_vllm
    pytester.makepyfile(test_checks=IMPORTS_VLLM)
    install("ok")
    args = ("--matrix", "m.yaml", "-p", "no:cacheprovider", "--junitxml=j.xml", "-o", "junit_family=xunit1")
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=3 * CELLS)
    install("quant_raises")
    start = time.monotonic()
    result = pytester.runpytest_subprocess(*args)
    seconds = time.monotonic() - start
    result.assert_outcomes(passed=CELLS, failed=1, errors=2 * CELLS - 1)
    root = ET.parse(pytester.path / "j.xml").getroot()
    first = [tc for tc in root.iter("testcase") if tc.find("failure") is not None]
    assert len(first) == 1 and "cudaLibrary_t" in first[0].find("failure").get("message", "")
    shared = set(_errors(pytester).values())
    assert len(shared) == 2 and all("vLLM under test broken, not tested: config (import "
                                    "vllm.model_executor.layers.quantization" in m for m in shared)
    result.stdout.fnmatch_lines(["quantmatrix: vllm_health: broken: config (*"])
    xml = (pytester.path / "j.xml").read_text()
    assert xml.count(f'<property name="{P.NOT_TESTED}" value="{P.VLLM_BROKEN}"') == 2 * CELLS - 1
    assert seconds < 60, f"a stale ok took {seconds:.1f} s to turn into one shared cause"
    result = pytester.runpytest_subprocess(*args)  # the next session checks afresh: nothing stale is left
    result.assert_outcomes(passed=CELLS, errors=2 * CELLS)


def test_an_import_error_behind_the_adapters_own_error_counts_as_unpredicted():
    """adapter/nvfp4.py names an import it cannot make as an AdapterMismatch raised from the import's error: that
    is an import failure for the stale-verdict watch (the cpu tier's dequant_logits cases met it first); an error
    of the case's own is not."""
    from quantmatrix.errors import AdapterMismatch
    from quantmatrix.pytest_plugin.health import _import_failure

    def adapter() -> None:
        try:
            __import__("quantmatrix_no_such_module.inner")
        except ImportError as e:
            raise AdapterMismatch("vLLM x: no dequantize_to_dtype; update quantmatrix/adapter/nvfp4.py") from e

    with pytest.raises(AdapterMismatch) as wrapped:
        adapter()
    assert _import_failure(wrapped)
    with pytest.raises(AssertionError) as own:
        assert 1 == 2
    assert not _import_failure(own)
