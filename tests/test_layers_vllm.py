"""Layer-level dispatch and the post-load audit against the installed vLLM: green as shipped, red (with the
right names) when the weight-only fix is reverted or an expert's input_scale is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prefix_bug import revert_weight_only_promotion

from quantmatrix.adapter import layers, simulate
from quantmatrix.checkpoints import store
from quantmatrix.checks import audit
from quantmatrix.errors import AdapterMismatch
from quantmatrix.measure import sentinel
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = load(ROOT / "matrices" / "default.yaml")
SEED_SHAPED = ["qwen3moe-tiny-nvfp4-weight-only", "qwen3moe-tiny-nvfp4-weight-only-key-missing",
               "mixtral-tiny-nvfp4-weight-only", "qwen3moe-tiny-nvfp4-weight-only-stray-input-scales"]


@pytest.fixture(scope="module", autouse=True)
def vllm_imported_here(tmp_path_factory):
    """Build one layer in this process first: pytester's in-process runs drop modules they imported, and vLLM
    registers types at import that cannot be registered twice."""
    import os

    old = os.environ.get("QUANTMATRIX_CACHE")
    os.environ["QUANTMATRIX_CACHE"] = str(tmp_path_factory.mktemp("qm"))
    try:
        layers.build(store.materialize(_checkpoint("qwen3moe-tiny-nvfp4-w4a4")), DEFAULT.arch("sm121").capability)
    finally:
        if old is None:
            del os.environ["QUANTMATRIX_CACHE"]
        else:
            os.environ["QUANTMATRIX_CACHE"] = old


def _checkpoint(checkpoint_id: str):
    return next(c for c in DEFAULT.checkpoints if c.id == checkpoint_id)


def _layer_run(pytester: pytest.Pytester, *extra: str, marks: str = "sm121 and default",
               checks: str = "layer_dispatch or post_load_audit") -> pytest.RunResult:
    return pytester.runpytest(str(ROOT / "suites" / "test_layers.py"), f"--rootdir={ROOT}", "-p", "no:cacheprovider",
                              "-m", marks, "-k", checks, *extra)


def test_layer_checks_pass_on_installed_vllm(pytester):
    """Every layer-dispatch, audit and rank-shards case of the default matrix passes on unmodified vLLM (simulated
    sm121), in every parallel layout: tp 2 and expert parallel 2 for every quantized NVFP4 checkpoint, one FP8
    export per producer, the healthy MIXED_PRECISION one, the W8A8 INT8 one, the WNA16 ones vLLM builds, two
    MXFP8 ones and the gpt-oss MXFP4 one, tp 4 for the healthy exports, and tp 8, which cannot split their NVFP4
    groups, refused by vLLM as it must be."""
    result = _layer_run(pytester, "-rA", checks="layer_dispatch or post_load_audit or rank_shards")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.outlines[-30:]
    # the waived AWQ audits and shards under expert parallel (3 AWQ exports x 2 checks)
    assert outcomes["passed"] >= 2 * 20 and outcomes["xfailed"] == 6
    passed = [line for line in result.outlines if line.startswith("PASSED")]
    # 21 quantized NVFP4 checkpoints, 3 FP8 ones (one healthy export per producer), the healthy MIXED_PRECISION one
    # the healthy W8A8 INT8 one, 2 MXFP8 ones (healthy, scales a block short) and the healthy gpt-oss MXFP4 one x 3
    # checks, less the audit and shards of the config vLLM must refuse; 7 WNA16
    # ones that vLLM builds x 3 checks, under expert parallel less the 3 AWQ audits and 3 AWQ shards the matrix
    # waives (xfail); the 2 groups-of-64 (Marlin) WNA16 ones x rank_shards alone; 4 healthy exports x 3; at tp 8
    # only rank_shards passes (the refusal is what it demands), the others skip
    for layout, cases in (("tp2", 3 * 29 - 2 + 3 * 7 + 2), ("tp2_ep", 3 * 29 - 2 + 3 * 7 - 6 + 2), ("tp4", 3 * 4),
                          ("tp8", 4)):
        assert sum(line.endswith(f"-{layout}]") for line in passed) == cases, layout
    for leaf in ("weight", "weight_packed"):  # ModelOpt's and compressed-tensors' names: 2 checkpoints x 2 checks
        result.stdout.fnmatch_lines([f"SKIPPED [[]4[]] *: vLLM refuses layout tp8, as it must (model.layers.0.mlp."
                                     f"experts.*.down_proj.{leaf} [[]64, 32[]]: 32 along axis 1 (4 blocks of 8) cannot "
                                     "be split evenly over 8 ranks): ValueError: Tensor parallel size 8 is greater "
                                     "than the number of experts 4."])


def test_reverted_fix_fails_weight_only_cells_on_dispatch_and_audit(pytester, monkeypatch):
    """Pre-fix vLLM: each seed-shaped weight-only checkpoint fails layer dispatch AND the audit, which names
    w13_input_scale and w2_input_scale as read by the W4A4 backend and never loaded."""
    revert_weight_only_promotion(monkeypatch)  # in this process: the one-rank layout's cases
    result = _layer_run(pytester, "-rf", marks="sm121 and default and tp1")
    failed = [line for line in result.outlines if line.startswith("FAILED")]
    for ck in SEED_SHAPED:
        assert any(f"test_layer_dispatch[{ck}@" in line for line in failed), ck
    for ck in SEED_SHAPED[:3]:  # the stray-input-scales export really holds input_scale: loaded, so no audit hole
        assert any(f"test_post_load_audit[{ck}@" in line for line in failed), ck
    result.stdout.fnmatch_lines([
        "*weight-only NVFP4 checkpoint built as W4A4 NVFP4 MoE (ModelOptNvFp4FusedMoE, backend VLLM_CUTLASS) on "
        "sm121 (GB10 / DGX Spark)*uninitialised input_scale*",
        "*backend VLLM_CUTLASS reads tensors that were never loaded from the checkpoint: "
        "model.layers.0.mlp.experts.routed_experts.w13_input_scale [[]experts 0-3[]]: unloaded*"
        "w2_input_scale [[]experts 0-3[]]: unloaded*weight-only checkpoint routed to a W4A4 fused-MoE backend*",
    ])
    assert all("-ct-" not in line for line in failed)  # compressed-tensors has no promotion to revert


def test_one_missing_expert_input_scale_is_named_by_layer_and_expert(tmp_path, monkeypatch):
    """W4A4 with expert 3 of layer 1 lacking input_scale: the audit names exactly that expert's rows."""
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path))
    ck = _checkpoint("qwen3moe-tiny-nvfp4-w4a4-expert-missing-input-scale")
    path = store.materialize(ck)
    arch = DEFAULT.arch("sm121")
    build = layers.build(path, arch.capability, every_layer=True)
    backend = DEFAULT.moe_backends[build.layer.backend]
    report = sentinel.audit(build.layers, sentinel.checkpoint_tensors(path), backend.reads, backend.single_input_scale)
    holes = {(f.param, f.experts) for f in report.read_but_unloaded}
    assert holes == {("model.layers.1.mlp.experts.routed_experts.w13_input_scale", (3,)),
                     ("model.layers.1.mlp.experts.routed_experts.w2_input_scale", (3,))}
    message = audit.problem_of(report, ck.id, weight_only_checkpoint=False)
    assert "model.layers.1.mlp.experts.routed_experts.w13_input_scale [expert 3]: unloaded (2/8 elements)" in message


def test_weight_only_under_marlin_records_input_scale_as_unread_not_failed(tmp_path, monkeypatch):
    """input_scale created but never read (weight-only under MARLIN) is a note, not a failure."""
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path))
    path = store.materialize(_checkpoint("qwen3moe-tiny-nvfp4-weight-only"))
    build = layers.build(path, DEFAULT.arch("gb10").capability, every_layer=True)
    assert build.layer.backend == "MARLIN"
    # the width the block takes: the checkpoint's hidden_size (the observed-reads measurement feeds it that wide)
    hidden = json.loads((path / "config.json").read_text())["hidden_size"]
    assert [layer.hidden_size for layer in build.layers] == [hidden, hidden] and hidden == 64
    backend = DEFAULT.moe_backends["MARLIN"]
    report = sentinel.audit(build.layers, sentinel.checkpoint_tensors(path), backend.reads, backend.single_input_scale)
    assert audit.problem_of(report, "x", True) is None
    assert {f.param.rsplit(".", 1)[1] for f in report.notes if f.kind == "unloaded"} == {"w13_input_scale",
                                                                                          "w2_input_scale"}


@pytest.mark.parametrize(("arch", "backend"), [("sm100", "VLLM_CUTLASS"), ("sm120", "VLLM_CUTLASS"),
                                               ("sm121", "VLLM_CUTLASS"), ("sm90", "MARLIN")])
def test_w4a4_backend_per_simulated_arch_without_flashinfer(tmp_path, monkeypatch, arch, backend):
    """Without flashinfer, vLLM picks VLLM_CUTLASS on Blackwell and MARLIN on Hopper for W4A4 NVFP4 MoE."""
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path))
    path = store.materialize(_checkpoint("qwen3moe-tiny-nvfp4-w4a4"))
    build = layers.build(path, DEFAULT.arch(arch).capability)
    assert (build.layer.backend, build.layer.weight_only) == (backend, False)


@pytest.mark.parametrize(("checkpoint_id", "method"), [
    ("qwen3moe-tiny-gptq-w4a16-g32", "MoeWNA16Method"), ("qwen3moe-tiny-awq-w4a16-g32", "MoeWNA16Method"),
    ("qwen3moe-tiny-ct-w4a16-g32", "CompressedTensorsWNA16MoEMethod")])
@pytest.mark.parametrize("arch", ["sm90", "sm121"])
def test_wna16_takes_triton_at_hidden_64_on_every_simulated_arch(tmp_path, monkeypatch, checkpoint_id, method, arch):
    """vLLM 0.32's WNA16 oracle, past its CPU experts (the simulation answers is_cpu False): Marlin does not fit
    the tiny 64-wide experts, so GPTQ and AWQ fall back to MoeWNA16Method, and every export runs TRITON."""
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path))
    build = layers.build(store.materialize(_checkpoint(checkpoint_id)), DEFAULT.arch(arch).capability)
    assert (build.layer.method, build.layer.backend, build.layer.scheme, build.layer.weight_only) == (
        method, "WNA16_TRITON", "weight_only", True)


def test_simulation_restores_the_platform_and_fails_loudly_when_it_does_not_take(monkeypatch):
    """After simulate() vLLM sees the CPU platform again; a seam that stops working raises, never skips."""
    from vllm.platforms import current_platform

    before = current_platform.get_device_capability()
    with simulate.simulate(DEFAULT.arch("sm120").capability):
        assert tuple(current_platform.get_device_capability()) == (12, 0)
        assert not current_platform.has_device_capability(121)
        assert not current_platform.is_cpu()  # a simulated CUDA device is not the CPU
    assert current_platform.get_device_capability() == before and current_platform.is_cpu()
    monkeypatch.setattr(simulate, "check_simulation", lambda cap: (_ for _ in ()).throw(
        AdapterMismatch("simulated capability did not take")))
    with pytest.raises(AdapterMismatch), simulate.simulate(DEFAULT.arch("sm120").capability):
        pass
    assert current_platform.get_device_capability() == before


def test_a_pinned_audit_expectation_fails_a_checkpoint_missing_one_planted_fault(tmp_path, monkeypatch):
    """The bad-scale-values export without its inf input_scale: the audit still finds `zero` and `nonfinite`, so
    the kind-only expectation passes it; the matrix's pins (each fault on its tensor) fail it and name the one
    that is gone. The full export passes its pins."""
    import dataclasses

    from quantmatrix.schema.model import Source

    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path))
    arch = DEFAULT.arch("sm121")
    ck = _checkpoint("qwen3moe-tiny-nvfp4-w4a4-bad-scale-values")
    pins = ck.expectation("audit", arch)
    corrupt = tuple(p for p in ck.source.value["corrupt_tensors"]
                    if p[0] != "model.layers.0.mlp.experts.1.down_proj.input_scale")
    assert len(corrupt) == 2
    two = dataclasses.replace(ck, id=ck.id + "-two", source=Source(
        "synthetic", {**ck.source.value, "corrupt_tensors": corrupt}, ck.source.where))
    reports = {}
    for c in (ck, two):
        path = store.materialize(c)
        build = layers.build(path, arch.capability, every_layer=True)
        backend = DEFAULT.moe_backends[build.layer.backend]
        reports[c.id] = sentinel.audit(build.layers, sentinel.checkpoint_tensors(path), backend.reads,
                                       backend.single_input_scale)
    assert len(pins) == 3 and audit.problem_of(reports[ck.id], ck.id, False, pins) is None
    assert audit.problem_of(reports[two.id], two.id, False, ("zero", "nonfinite")) is None
    problem = audit.problem_of(reports[two.id], two.id, False, pins)
    assert problem.endswith("[the matrix also expected: nonfinite on "
                            "model.layers.0.mlp.experts.1.down_proj.input_scale]"), problem
