"""A GPU host where vLLM is not installed: the torch-level gpu checks still run (detection, exact-family markers,
--strict-hardware, device_identity); every case that needs vLLM is skipped with the reason, or, under
--strict-hardware (the nightly on a GPU runner), fails with one shared cause, as does every case whose synthetic
checkpoint needs compressed-tensors (which only vLLM brought in); `quantmatrix detect` exits 1 there.

Faked here, as this host has neither a GPU nor a missing vLLM: the CUDA queries (nvidia-smi reports one GB10),
the GPU probe's child process (it answers as a GB10 whose allocator obeys the mode), and vLLM's absence (its
import is blocked, so the plugin's own import check is what decides). The suite files are the real suites/."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from quantmatrix import properties as P
from quantmatrix.host import detect, probe
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parents[1]
GB10 = detect.Device(0, "NVIDIA GB10", (12, 1))
PATH_MATRIX = """\
version: 1
archs:
  - {name: sm120, capability: "12.0", aliases: [rtx_pro_6000], label: RTX PRO 6000}
  - {name: sm121, capability: "12.1", aliases: [gb10, dgx_spark], label: GB10 / DGX Spark}
modes:
  - {name: default, label: caching allocator}
  - name: nocache
    env: {PYTORCH_NO_CUDA_MEMORY_CACHING: "1"}
    label: no caching allocator
schemes:
  - {name: bf16, marker: bf16, label: bf16, expect: {quant_method: none, resolves_to: unquantized}}
checks:
  - {name: config_dispatch, kind: dispatch, tier: cpu, description: needs vLLM}
  - {name: device_identity, kind: hardware, tier: gpu, description: needs torch only}
checkpoints:
  - {id: local-bf16, source: {path: ck}, producer: none, scheme: bf16}
"""


def _fake_probe(env):
    """What the child probe reports on a GB10: nothing stays reserved exactly when caching is off."""
    no_cache = env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
    return probe.Seen("NVIDIA GB10", (12, 1), 1, 0 if no_cache else 2 << 20)


@pytest.fixture
def gb10_without_vllm(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setattr(detect, "query_nvidia_smi", lambda: [GB10])
    monkeypatch.setattr(detect, "query_torch", lambda: ([GB10], ""))
    monkeypatch.delenv(detect.ARCH_ENV, raising=False)
    monkeypatch.setattr(probe, "run", _fake_probe)
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError, as when absent
    for name in ("test_hardware", "test_dispatch"):
        pytester.makepyfile(**{name: (ROOT / "suites" / f"{name}.py").read_text()})
    return pytester


def test_gpu_tier_of_the_default_matrix_runs_with_cuda_queries_probe_and_missing_vllm_faked(gb10_without_vllm):
    """`-m "sm121 and gpu" --strict-hardware` on a GB10 without vLLM: detection finds the GB10 and every
    device_identity case of the default matrix passes (each bf16 checkpoint in each non-poison mode)."""
    default = load(ROOT / "matrices" / "default.yaml")
    n = sum(1 for case in default.cases(default.checks["device_identity"]) if case.cell.arch.name == "sm121")
    result = gb10_without_vllm.runpytest("test_hardware.py", "--matrix", str(default.path),
                                         "-m", "sm121 and gpu", "--strict-hardware", "-v")
    assert n >= 6
    result.assert_outcomes(passed=n)
    result.stdout.fnmatch_lines(["*host cuda:0 NVIDIA GB10 [[]sm121 (GB10 / DGX Spark)[]] (via nvidia-smi)*"])
    assert all("@sm121-" in line for line in result.outlines if "PASSED" in line)


def test_strict_hardware_still_fails_other_families_with_cuda_queries_and_missing_vllm_faked(gb10_without_vllm):
    """Exact families, never `>=`: the sm120 cases are not this GB10's; --strict-hardware makes them errors."""
    default = load(ROOT / "matrices" / "default.yaml")
    n = sum(1 for case in default.cases(default.checks["device_identity"]) if case.cell.arch.name == "sm120")
    result = gb10_without_vllm.runpytest("test_hardware.py", "--matrix", str(default.path),
                                         "-m", "sm120 and gpu", "--strict-hardware")
    assert n >= 6
    result.assert_outcomes(errors=n)
    result.stdout.fnmatch_lines(["*--strict-hardware: needs sm120 (RTX PRO 6000); this host: cuda:0 NVIDIA GB10*"])


def test_vllm_cases_skip_with_the_reason_while_gpu_cases_run_with_cuda_queries_and_missing_vllm_faked(
        gb10_without_vllm):
    """In one run on a GB10 without vLLM and without --strict-hardware: the vLLM-needing config_dispatch cases
    skip, saying vLLM is not importable and why; the torch-only device_identity cases of the same checkpoint run
    and pass."""
    (gb10_without_vllm.path / "ck").mkdir()
    (gb10_without_vllm.path / "ck" / "config.json").write_text("{}")
    gb10_without_vllm.makefile(".yaml", m=PATH_MATRIX)
    result = gb10_without_vllm.runpytest("--matrix", "m.yaml", "-m", "sm121", "-rs")
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines(["*SKIPPED [[]2[]] test_dispatch.py:*: vLLM is not importable here (*vllm*)"])


def test_under_strict_hardware_a_gpu_host_without_vllm_fails_every_vllm_case_with_one_cause_with_cuda_queries_and_missing_vllm_faked(  # noqa: E501
        gb10_without_vllm, monkeypatch):
    """The nightly on a GB10 runner whose vLLM is gone (`--strict-hardware`, the real suites over the default
    matrix's sm121 cells): no skip and no per-case import error. Every case that needs vLLM fails with the one
    shared message and is counted "not tested"; every case of a compressed-tensors synthetic checkpoint that needs
    no vLLM fails naming the missing package; device_identity and the rest pass or judge as before."""
    monkeypatch.setitem(sys.modules, "compressed_tensors", None)
    gb10_without_vllm.makepyfile(test_checkpoints=(ROOT / "suites" / "test_checkpoints.py").read_text())
    default = load(ROOT / "matrices" / "default.yaml")
    result = gb10_without_vllm.runpytest("--matrix", str(default.path), "-m", "sm121", "-k",
                                         "config_dispatch or device_identity or (checkpoint_lint and ct)",
                                         "--strict-hardware", "--junitxml=j.xml", "-o", "junit_family=xunit1",
                                         "-p", "no:cacheprovider")
    assert not [ln for ln in result.outlines if "SKIPPED" in ln or "ImportError" in ln]
    root = ET.parse(gb10_without_vllm.path / "j.xml").getroot()
    messages = {tc.get("name"): next((r.get("message", "") for r in tc if r.tag in ("failure", "error")), None)
                for tc in root.iter("testcase")}
    props = {tc.get("name"): {p.get("name"): p.get("value") for p in tc.iter("property")}
             for tc in root.iter("testcase")}
    needs = {c.check.name for c in (case for check in default.checks.values() for case in default.cases(check))
             if c.check.vllm}
    vllm_cases = [n for n in messages if n.split("[")[0].removeprefix("test_") in needs]
    assert vllm_cases and all(messages[n] and "vLLM under test broken, not tested: config (vLLM is not installed: "
                              in messages[n] for n in vllm_cases)
    assert all(props[n].get(P.NOT_TESTED) == P.VLLM_BROKEN for n in vllm_cases)
    ct = [n for n in messages if n not in vllm_cases and "-ct-" in n]
    assert ct and all("the compressed-tensors producer builds" in messages[n]
                      and "Python package compressed-tensors, which is not installed" in messages[n] for n in ct)
    assert any(n.startswith("test_device_identity") and messages[n] is None for n in messages)
    suite = {p.get("name"): p.get("value") for p in root.find("testsuite").find("properties")}
    assert suite[P.VLLM_HEALTH].startswith("broken: config (vLLM is not installed")


def test_detect_exits_1_on_a_gpu_host_without_vllm_and_0_on_a_cpu_host_with_cuda_queries_and_missing_vllm_faked(
        gb10_without_vllm, capsys, monkeypatch):
    from quantmatrix import cli

    assert cli.main(["detect", "--matrix", str(ROOT / "matrices" / "default.yaml")]) == 1
    out = capsys.readouterr().out
    assert "host: cuda:0 NVIDIA GB10" in out and "vLLM is not installed" in out
    monkeypatch.setattr(detect, "query_nvidia_smi", lambda: None)
    monkeypatch.setattr(detect, "query_torch", lambda: ([], "CPU build of torch"))
    assert cli.main(["detect", "--matrix", str(ROOT / "matrices" / "default.yaml")]) == 0
    assert "no vLLM installed" in capsys.readouterr().out
