"""What the engine runner (parent), the engine child and the poison plugin agree on: environment names and the
child's command line. The request and result are JSON files written with atomic.write_atomic."""

from __future__ import annotations

# Set by a poison mode; read by engine.poison inside every engine process.
POISON_ENV = "QUANTMATRIX_POISON"
# Test-only: make the child misbehave before vLLM is imported, so the runner's timeout and crash handling are
# tested without an engine. Values: hang (also leaves a grandchild in the process group), segfault, exit.
FAULT_ENV = "QUANTMATRIX_TEST_CHILD_FAULT"
# guard.plugin.ENV, named here because the engine ranks below the guard: the `guard` mode sets it.
GUARD_ENV = "QUANTMATRIX_GUARD"
# Set by the runner for a mode with a `sanitizer:` knob: engine.params records every parameter and buffer's address
# range inside the engine, which the sanitizer's report is mapped back through (measure.uninit).
RECORD_ENV = "QUANTMATRIX_RECORD_PARAMS"
# The two records' stages: right after the model is built, right after process_weights_after_loading.
BUILT, PROCESSED = "built", "processed"
# The start of the line the guard logs once it has judged a model (guard.plugin): a guard mode whose engine log lacks
# it never ran the guard (VLLM_PLUGINS leaving it out, a load format it does not reach) and proves nothing.
GUARD_RAN = "quantmatrix guard ran ("
# Set by a mode, never inherited from the shell that started pytest (a runner with QUANTMATRIX_GUARD in its own
# environment would otherwise run every mode guarded).
MODE_ONLY_ENV = (POISON_ENV, FAULT_ENV, GUARD_ENV, RECORD_ENV)
# compute-sanitizer's --log-file in a group's run directory. %p is a pid: the followed process's (one log each,
# matched to the worker with that pid) or, as NVIDIA's manual words it for some releases, compute-sanitizer's own
# (one log for every process; measure.sanitized maps it through the one worker that held the model). Not yet seen
# on a GPU: the first sanitized run's uninit_attribution property says which.
SANITIZER_LOG = "sanitizer.%p.log"
# adapter.engine.on_every_worker: LLM.apply_model cloudpickles its function to the engine processes.
ENGINE_ENV = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
# `python -m CHILD_MODULE REQUEST.json RESULT.json`
CHILD_MODULE = "quantmatrix.engine.child"
