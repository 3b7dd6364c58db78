"""The guard against issue 31's odd inputs, in process (tests/test_guard.py runs the real engine starts: the NaN final
norm refused, the FP8 checkpoint judged and passed): every floating dtype torch has judged for non-finite values,
FP8 included; scales no producer module names judged as scales; a load that writes param.data directly (vLLM's own
ShardedStateLoader on vLLM's own layers) recognised as loaded; the seams patched in every loader module and a load
the guard did not judge failed; the QUANTMATRIX_GUARD_BACKENDS file read as a backends-only override, and one that
drops a read refused."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
import torch

from quantmatrix.adapter import layers
from quantmatrix.checkpoints import store
from quantmatrix.errors import MatrixError
from quantmatrix.guard import plugin
from quantmatrix.guard.record import Recorder
from quantmatrix.measure import findings, sentinel
from quantmatrix.schema import backends
from quantmatrix.schema.load import load
from quantmatrix.schema.overrides import override_file

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = load(ROOT / "matrices" / "default.yaml")
FLOATS = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype) and v.is_floating_point
                 and not v.is_complex}, key=str)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_every_floating_dtype_torch_has_is_judged_and_a_nan_found_where_it_can_be_written(dtype):
    """Asked of torch, not listed: whatever floating dtypes it has. A NaN (where the format has one) is found; a
    finite tensor passes; nothing raises (float8_e4m3fn once raised NotImplementedError: NOT RUNNING)."""
    zeros = torch.zeros(4, 8, dtype=torch.uint8).view(dtype) if dtype.itemsize == 1 else torch.zeros(4, 8, dtype=dtype)
    assert findings.all_finite(zeros) and findings.nonfinite("x.weight", zeros) == []
    try:
        nan = torch.tensor([float("nan")]).to(dtype)
    except (RuntimeError, TypeError, NotImplementedError):
        return  # torch cannot even write a NaN of it (float4 e2m1 has none)
    if not torch.isnan(nan.float() if dtype.itemsize == 1 else nan).any():
        return  # the format saturates or has no NaN: nothing non-finite to find
    bad = zeros.clone()
    bad.view(-1)[5] = nan[0]
    (f,) = findings.nonfinite("x.weight", bad)
    assert (f.kind, f.detail) == ("nonfinite", "1 NaN")


def test_an_fp8_expert_tensor_larger_than_a_chunk_is_judged_in_chunks(monkeypatch):
    monkeypatch.setattr(findings, "_CHUNK", 64)
    w = torch.ones(8, 4, 16).to(torch.float8_e4m3fn)
    assert findings.all_finite(w)
    w[6, 1, 3] = float("nan")
    assert not findings.all_finite(w)
    report = findings.measure_layer({"e.w13_weight": w}, {"e.w13_weight": torch.zeros(8, 1, 1, dtype=torch.bool)},
                                    "B", frozenset({"weight"}), False, 8)
    assert [(f.kind, f.experts, f.detail) for f in report.findings] == [("nonfinite", (6,), "1 NaN")]


@pytest.mark.parametrize(("name", "role"), [
    ("model.layers.0.mlp.experts.w13_weight_scale_inv", "block_scale"),
    ("model.layers.0.self_attn.qkv_proj.weight_scale_inv", "block_scale"),
    ("model.layers.0.mlp.experts.w2_weight_scale", "block_scale"),
    ("model.layers.0.mlp.experts.w13_input_scale", "input_scale"),
    ("model.layers.0.self_attn.attn.k_scale", "other"),
    ("model.layers.0.mlp.gate.e_score_correction_bias", "other"),
])
def test_every_scale_kind_has_a_role(name, role):
    assert findings.tensor_role(name) == role


def test_an_unloaded_weight_scale_inv_is_judged_as_a_read_scale():
    """FP8 block quantization's scale: once "other", so never loaded passed silently."""
    p = torch.ones(4, 2, 2)
    report = findings.measure_layer({"e.w13_weight_scale_inv": p},
                                    {"e.w13_weight_scale_inv": torch.tensor([True, False, False, False])
                                     .reshape(4, 1, 1)}, "B", frozenset({"weight", "block_scale"}), False, 4)
    assert [(f.kind, f.experts, f.read) for f in report.read_but_unloaded] == [("unloaded", (0,), True)]
    p[2, 0, 0] = -1.0
    bad = findings.measure_layer({"e.w13_weight_scale_inv": p}, {"e.w13_weight_scale_inv": torch.tensor(False)},
                                 "B", frozenset({"weight", "block_scale"}), False, 4)
    assert [(f.kind, f.experts) for f in bad.unusable] == [("negative", (2,))]


# ------------------------------------------------------------------------------- load formats (real vLLM)


@pytest.fixture(scope="module")
def weight_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ck = next(c for c in DEFAULT.checkpoints if c.id == "qwen3moe-tiny-nvfp4-weight-only")
    return store.materialize(ck)


def test_a_sharded_state_load_that_writes_param_data_directly_is_recognised_as_loaded(weight_only, tmp_path, caplog):
    """vLLM's own ShardedStateLoader on vLLM's own MoE blocks: saved from a normal load, loaded into fresh blocks by
    copying param.data (no weight_loader call). Every tensor once read as never loaded, so a healthy model was
    refused; now the guard says it could not measure loadedness and judges the values."""
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import ShardedStateLoader

    cap = DEFAULT.arch("sm121").capability
    saved = layers.build(weight_only, cap, every_layer=True)
    for i, layer in enumerate(saved.layers):
        layer.load(sentinel.checkpoint_tensors(weight_only, layer.prefix)())
        (tmp_path / str(i)).mkdir()
        ShardedStateLoader.save_model(layer.block, str(tmp_path / str(i)))
    fresh = layers.build(weight_only, cap, every_layer=True)
    recorder = Recorder()
    loader = ShardedStateLoader(LoadConfig(load_format="sharded_state"))
    for i, layer in enumerate(fresh.layers):
        recorder.install(layer.block, layer.prefix)
        config = copy.copy(fresh.layer.vllm_config.model_config)
        config.model, config.model_weights = str(tmp_path / str(i)), ""
        loader.load_weights(layer.block, config)
    assert recorder.calls == 0
    with caplog.at_level(logging.INFO, logger="vllm.quantmatrix_guard"):
        outcome = plugin.guard_model(recorder, fresh.layer.vllm_config.model_config, "refuse")
    assert outcome.direct and outcome.problems == []
    assert any("wrote param.data directly" in r.getMessage() for r in caplog.records)
    nan = next(p for layer in fresh.layers for n, p in layer.block.named_parameters() if n.endswith("w13_weight_scale"))
    nan.data.view(torch.uint8)[0] = 0x7F  # one NaN block scale: values are still judged
    recorder = Recorder()
    for layer in fresh.layers:
        recorder.install(layer.block, layer.prefix)
    with pytest.raises(plugin.GuardRefusal, match="nonfinite"):
        plugin.guard_model(recorder, fresh.layer.vllm_config.model_config, "refuse")


def test_the_seams_are_patched_in_every_loader_module_that_imported_them(monkeypatch):
    """tensorizer and ipc_cache import initialize_model / process_weights_after_loading into their own modules: the
    guard once patched base_loader only, said "installed" and never judged under them."""
    import vllm.model_executor.model_loader.base_loader as base
    import vllm.model_executor.model_loader.tensorizer_loader as tensorizer
    import vllm.model_executor.model_loader.weight_cache.ipc_loader as ipc

    monkeypatch.setenv(plugin.ENV, "warn")
    monkeypatch.setattr(plugin, "_installed", False)
    for module in (base, tensorizer, ipc):
        for name in ("initialize_model", "process_weights_after_loading"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    from vllm.model_executor.model_loader import BaseModelLoader, ShardedStateLoader, TensorizerLoader

    for cls in (BaseModelLoader, TensorizerLoader, ShardedStateLoader):
        if "load_model" in vars(cls):
            monkeypatch.setattr(cls, "load_model", vars(cls)["load_model"])
    plugin.register()
    assert tensorizer.initialize_model is base.initialize_model
    assert ipc.initialize_model is base.initialize_model
    assert ipc.process_weights_after_loading is base.process_weights_after_loading
    assert base.initialize_model.__wrapped__ is not None
    assert hasattr(TensorizerLoader.load_model, "__wrapped__")


@pytest.mark.parametrize("wanted", ["refuse", "warn"])
def test_a_load_the_guard_did_not_judge_fails_or_logs_an_error(wanted, monkeypatch, caplog):
    """A load format whose path passes neither seam (ipc_cache's zero-copy mode skips post-processing) never serves
    a model as checked: refuse stops, warn logs at ERROR."""
    monkeypatch.setenv(plugin.ENV, wanted)
    judged: set[int] = set()
    model = object()
    load = plugin._checked_load(lambda *a, **k: model, "IpcModelLoader", judged=judged)
    with caplog.at_level(logging.ERROR, logger="vllm.quantmatrix_guard"):
        if wanted == "refuse":
            with pytest.raises(plugin.GuardFailed, match="IpcModelLoader loaded the model without the guard judging"):
                load()
        else:
            assert load() is model
            assert any("NOT RUNNING" in r.getMessage() for r in caplog.records)
    judged.add(id(model))
    assert load() is model and not judged  # judged: passes, and the mark is spent


# --------------------------------------------------------------------------------- the backends override


def test_a_backends_only_override_is_accepted_and_one_that_drops_a_read_is_refused(tmp_path):
    f = tmp_path / "b.yaml"
    f.write_text("moe_backends:\n  - {name: NEW_KERNEL, reads: [weight, block_scale], label: n}\n"
                 "  - {name: MARLIN, reads: [weight, block_scale, global_scale, input_scale], label: m}\n")
    got = override_file(f)
    assert got["NEW_KERNEL"].reads == {"weight", "block_scale"} and "input_scale" in got["MARLIN"].reads
    assert got["VLLM_CUTLASS"] == backends.package_backends()["VLLM_CUTLASS"]
    f.write_text("moe_backends:\n  - {name: VLLM_CUTLASS, reads: [], label: seed bug}\n")
    with pytest.raises(MatrixError, match=r"b.yaml:2:5: moe_backends: VLLM_CUTLASS drops block_scale, global_scale, "
                                          r"input_scale, weight, which vLLM's own VLLM_CUTLASS kernels read"):
        override_file(f)
    f.write_text("moe_backends: []\nversion: 1\n")
    with pytest.raises(MatrixError, match="missing required key 'archs'"):
        override_file(f)  # not backends-only: validated as the whole matrix it claims to be


# ----------------------------------------------------------------------------------------- the guard mode


def _guard_run(tmp_path: Path, log: str):
    from quantmatrix.engine.runner import GroupRun
    from quantmatrix.schema.model import Case, Cell

    ck = next(c for c in DEFAULT.checkpoints if c.id == "qwen3moe-tiny-bf16")
    case = Case(DEFAULT.checks["degeneration"], Cell(ck, DEFAULT.archs[0], DEFAULT.mode("guard")), None)
    (tmp_path / "engine.log").write_text(log)
    result = {"workers": [{"pid": 2, "moe_layers": {}, "poison": {"requested": None}}]}
    return case, GroupRun("c", tmp_path, {"poison": None, "guard": "refuse", "greedy_prompts": 0}, result, None, 1.0)


def test_a_guard_mode_whose_engine_never_logged_the_guard_ran_fails_the_cell(tmp_path):
    """A guard mode whose VLLM_PLUGINS leaves the guard out once passed without the guard ever running."""
    from quantmatrix.checks import e2e as verdicts

    case, run = _guard_run(tmp_path, "INFO vLLM started\n")
    problem = verdicts.engine_problem(case, run)
    assert problem is not None and "QUANTMATRIX_GUARD='refuse'" in problem and "never judged the model" in problem
    case, run = _guard_run(tmp_path, "INFO quantmatrix guard ran (refuse): checked 30 tensors in 8 layers\n")
    assert verdicts.engine_problem(case, run) is None
