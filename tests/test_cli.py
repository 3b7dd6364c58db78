"""`quantmatrix list | detect | run` as a maintainer types them."""

from __future__ import annotations

from pathlib import Path

import junitparser
import pytest
from matrixkit import SMALL, write

from quantmatrix import cli
from quantmatrix import properties as P
from quantmatrix.host import detect

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(detect, "query_nvidia_smi", lambda: None)
    monkeypatch.setattr(detect, "query_torch", lambda: ([], "faked"))
    monkeypatch.delenv(detect.ARCH_ENV, raising=False)


def test_list_prints_every_cell_with_its_checks(tmp_path, capsys):
    """`list` is a table of cells (checkpoint@arch-mode) with their checks and tiers, and the totals."""
    assert cli.main(["list", "--matrix", str(write(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "tiny-wo@sm121-nocache" in out and "cpu_probe(cpu), gpu_probe(gpu)" in out
    assert out.rstrip().endswith(f"12 cells, 18 cases from {tmp_path / 'm.yaml'}")
    assert out.splitlines()[0].split() == ["CELL", "SCHEME", "PRODUCER", "ARCH", "MODE", "LAYOUT", "CHECKS"]
    assert cli.main(["list", "--matrix", str(write(tmp_path, SMALL + "layouts:\n  - {tp: 2, ep: true}\n"))]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("tiny-wo@sm121-nocache-tp2_ep"))
    assert row.split()[-2:] == ["nocache", "tp2_ep"]  # no check runs outside the serving layout there


def test_detect_names_the_markers_this_host_satisfies_with_cuda_queries_faked(tmp_path, capsys, no_cuda,
                                                                               monkeypatch):
    """`detect` on a (faked) GB10 lists sm121 and its aliases, nothing else, plus the vLLM/torch versions."""
    monkeypatch.setattr(detect, "query_torch", lambda: ([detect.Device(0, "NVIDIA GB10", (12, 1))], ""))
    assert cli.main(["detect", "--matrix", str(write(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "gpu-tier markers this host satisfies: sm121 gb10 dgx_spark" in out
    assert "vllm_version:" in out and "torch_version:" in out


def test_detect_without_gpu_says_none(tmp_path, capsys, no_cuda):
    assert cli.main(["detect", "--matrix", str(write(tmp_path))]) == 0
    assert "gpu-tier markers this host satisfies: none" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan", "inf", ""])
def test_detect_health_timeout_that_is_not_a_positive_number_is_a_usage_error_naming_the_flag(tmp_path, capsys,
                                                                                             no_cuda, value):
    """`detect` takes the plugin's --vllm-health-timeout, with the plugin's validation: exit 2 naming the flag."""
    assert cli.main(["detect", "--matrix", str(write(tmp_path)), f"--vllm-health-timeout={value}"]) == 2
    assert (f"quantmatrix detect: error: --vllm-health-timeout needs a positive number of seconds, not '{value}'"
            in capsys.readouterr().err)


def test_detect_has_one_health_timeout_flag(tmp_path, capsys, no_cuda):
    """The old CLI-only spelling is gone: one flag name for the CLI and the plugin."""
    assert cli.main(["detect", "--matrix", str(write(tmp_path)), "--health-timeout", "30"]) == 2
    assert "unrecognized arguments: --health-timeout 30" in capsys.readouterr().err


def test_bad_matrix_is_reported_without_traceback(tmp_path, capsys):
    """A broken matrix exits 2 with file:line, as every quantmatrix error does."""
    path = write(tmp_path, "version: 2\n")
    assert cli.main(["list", "--matrix", str(path)]) == 2
    assert f"{path}:1:10: matrix.version: expected one of 1; got 2" in capsys.readouterr().err


def test_run_writes_junit_into_its_report_dir_and_passes_pytest_args(tmp_path, monkeypatch):
    """`run` executes suites/ into <out>/junit.xml (xunit1, per-case properties) with extra args passed on."""
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(ROOT)
    rc = cli.main(["run", "--run-id", "r", "--out", str(tmp_path / "r"), "-p", "no:cacheprovider", "-q",
                   "-m", "dispatch and sm121",
                   "-k", "config_dispatch and qwen3moe-tiny-nvfp4-weight-only and not missing and not stray"])
    assert rc == 0
    xml = junitparser.JUnitXml.fromfile(str(tmp_path / "r" / "junit.xml"))
    cases = [c for s in xml for c in s]
    assert len(cases) == 1  # once per checkpoint and arch: a mode does not change config resolution
    props = {p.name: p.value for block in cases[0].iterchildren(junitparser.Properties) for p in block}
    assert props[P.RESOLVED_SCHEME] == "weight_only" and props[P.VLLM_VERSION] != "not installed"
    suite = next(iter(xml))
    host = {p.name: p.value for p in suite.properties()}
    assert host[P.MATRIX].endswith("default.yaml") and host[P.RUN_ID] == "r" and P.TORCH_VERSION in host


def test_run_with_nothing_selected_is_not_a_pass(tmp_path, monkeypatch):
    """A selection that matches no case exits 5 (pytest's "no tests"), which CI treats as a failure."""
    monkeypatch.chdir(ROOT)
    rc = cli.main(["run", "--out", str(tmp_path / "r"), "-p", "no:cacheprovider", "-q", "-k", "no_such_case"])
    assert rc == pytest.ExitCode.NO_TESTS_COLLECTED


def test_lint_and_checkpoint_subcommands_are_wired(tmp_path, capsys, monkeypatch):
    """`quantmatrix checkpoint make` writes a checkpoint that `quantmatrix lint` then reads as clean."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "ck"
    assert cli.main(["checkpoint", "make", "qwen3moe-tiny-nvfp4-weight-only", "--out", str(out)]) == 0
    assert (out / "model.safetensors").is_file()
    capsys.readouterr()
    assert cli.main(["lint", str(out)]) == 0
    assert "OK: every tensor agrees with the declared scheme" in capsys.readouterr().out
