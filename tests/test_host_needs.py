"""A cpu cell's host needs (`cpu_cells[].needs`): host.cpu reads them from /proc/cpuinfo text and the installed
packages, and the gate skips a cell whose needs this host lacks on vLLM's CPU build, naming what is missing (an Intel
CPU without AMX, where vLLM 0.32 has no CPU kernel for the quantized MoE cells), before any engine starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantmatrix.adapter.versions import CPU_BUILD, versions
from quantmatrix.host import cpu
from quantmatrix.schema.load import load
from quantmatrix.schema.vocab import HOST_NEEDS

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = load(ROOT / "matrices" / "default.yaml")
# /proc/cpuinfo as the two kinds of host print it (first processor; flags cut to the ones that matter)
EPYC = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse avx2 avx512f avx512bw\n\nprocessor\t: 1\n"
XEON_NO_AMX = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse avx2 avx512f\n"
XEON_AMX = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n"
QUANTIZED = ("qwen3moe-tiny-ct-w4a16-g32", "qwen3moe-tiny-ct-w8a8-int8")  # the cpu cells only zentorch runs


def _cpu(cpuinfo: str, zentorch: bool) -> cpu.Cpu:
    return cpu.Cpu(*cpu.parse_cpuinfo(cpuinfo), zentorch, "test")


def test_every_word_the_schema_takes_is_one_the_host_can_answer():
    assert cpu.WORDS == HOST_NEEDS


@pytest.mark.parametrize(("cpuinfo", "zentorch", "lacking"), [
    (EPYC, True, ["amx: vLLM's own CPU experts need AMX tiles (flag amx_tile)"]),
    (EPYC, False, ["zen_cpu: vLLM's Zen CPU platform needs the zentorch package (setup.sh installs it on such a CPU)",
                   "amx: vLLM's own CPU experts need AMX tiles (flag amx_tile)"]),
    (XEON_NO_AMX, True, ["zen_cpu: vLLM's Zen CPU platform needs an AMD CPU with AVX-512",
                         "amx: vLLM's own CPU experts need AMX tiles (flag amx_tile)"]),
    (XEON_AMX, False, ["zen_cpu: vLLM's Zen CPU platform needs an AMD CPU with AVX-512"]),
    ("", False, ["zen_cpu: vLLM's Zen CPU platform needs an AMD CPU with AVX-512",
                 "amx: vLLM's own CPU experts need AMX tiles (flag amx_tile)"]),
])
def test_what_each_host_lacks(cpuinfo, zentorch, lacking):
    assert cpu.missing(HOST_NEEDS, _cpu(cpuinfo, zentorch)) == lacking


def _case(checkpoint: str, check: str, arch: str = "sm121"):
    """The matrix's case of `check` on the poison_nan cell, as it expands (a cpu cell's check is the cpu copy)."""
    return next(c for c in DEFAULT.cases(DEFAULT.checks[check]) if c.cell.id == f"{checkpoint}@{arch}-poison_nan")


def test_the_quantized_cpu_cells_need_zen_cpu_and_the_others_nothing():
    """The matrix, not code, says which cpu cells need what: every e2e check of the two zentorch cells, nothing for
    the bf16 ones, and nothing outside the cpu cells."""
    for check in ("degeneration", "agreement", "mode_invariance"):
        for ck in QUANTIZED:
            c = _case(ck, check)
            assert c.check.tier == "cpu" and c.check.host_needs(c.cell) == ("zen_cpu",)
        bf16 = _case("qwen3moe-tiny-bf16", check)
        assert bf16.check.tier == "cpu" and bf16.check.host_needs(bf16.cell) == ()
    elsewhere = _case(QUANTIZED[1], "degeneration", arch="sm100")
    assert elsewhere.check.tier == "gpu" and elsewhere.check.host_needs(elsewhere.cell) == ()


def _run_on(pytester, monkeypatch, host: cpu.Cpu, *args: str):
    """The suite's INT8 cpu cell on vLLM's CPU build, with this host's CPU as given."""
    monkeypatch.setitem(versions(), "vllm_distribution", CPU_BUILD)
    monkeypatch.setattr(cpu, "this_host", lambda: host)
    case_id = f"{ROOT / 'suites' / 'test_e2e.py'}::test_degeneration[{QUANTIZED[1]}@sm121-default]"
    return pytester.runpytest(case_id, f"--rootdir={ROOT}", "-p", "no:cacheprovider", "-rs", *args)


def test_an_intel_host_without_amx_skips_the_zentorch_cell_naming_what_it_lacks(pytester, monkeypatch):
    result = _run_on(pytester, monkeypatch, _cpu(XEON_NO_AMX, False))
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs zen_cpu to run on vLLM's CPU build (zen_cpu: vLLM's Zen CPU platform needs "
                                 "an AMD CPU with AVX-512); this host: GenuineIntel, avx512f; zentorch not "
                                 "installed (test)*"])


def test_strict_hardware_fails_it_instead(pytester, monkeypatch):
    result = _run_on(pytester, monkeypatch, _cpu(EPYC, False), "--strict-hardware")
    result.assert_outcomes(errors=1)  # failed in setup, before any fixture, as a missing arch is
    result.stdout.fnmatch_lines(["*--strict-hardware: needs zen_cpu to run on vLLM's CPU build (zen_cpu: vLLM's Zen "
                                 "CPU platform needs the zentorch package*"])
