"""The vLLM general plugin `quantmatrix_guard` (entry point quantmatrix.guard.plugin:register; vLLM calls it in every
process that may load weights: EngineCore, each worker, every tensor-parallel rank).

Inactive unless QUANTMATRIX_GUARD is set: `warn` logs the refusal once, with a count, and serves; any other
non-empty value means `refuse` and stops the engine before it serves. Right after vLLM builds the model the guard
wraps the MoE and linear parameters' weight_loaders (guard.record); right before `process_weights_after_loading`
turns the loaded tensors into kernel format it judges them (guard.judge) and unwraps. Nothing stays on the forward
path. Either way vLLM's log says that the guard ran and how many tensors it checked; a guard that cannot run says so
at ERROR level and, under `refuse`, stops the engine too (vLLM itself only logs a plugin that fails to import, so
this module imports nothing but the standard library and quantmatrix.adapter.engine, itself standard library only at
import, until `register` runs).
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any

from quantmatrix.adapter.engine import plugin_logger

ENV = "QUANTMATRIX_GUARD"
BACKENDS_ENV = "QUANTMATRIX_GUARD_BACKENDS"  # optional matrix file whose moe_backends override the packaged ones
_LOG = plugin_logger("quantmatrix_guard")  # its lines land in vLLM's own log


class GuardRefusal(RuntimeError):
    """The model would read tensors the checkpoint never supplied, or unusable values."""


class GuardFailed(RuntimeError):
    """The guard was asked for and could not run: the model is NOT checked."""


def mode() -> str | None:
    """None (inactive), "warn" or "refuse", from QUANTMATRIX_GUARD as it is now."""
    value = os.environ.get(ENV, "").strip().lower()
    if not value:
        return None
    return "warn" if value == "warn" else "refuse"


_installed = False


def register() -> None:
    """Install the guard's seams in this process (idempotent); a no-op unless QUANTMATRIX_GUARD is set."""
    global _installed
    wanted = mode()
    if wanted is None or _installed:
        return
    try:
        _install()
    except Exception as e:  # anything at all: the guard was asked for, so its absence must be visible
        _fail(wanted, f"could not install its seams in this vLLM ({type(e).__name__}: {e})")
    _installed = True


def _fail(wanted: str, why: str) -> None:
    message = (f"quantmatrix guard NOT RUNNING ({ENV}={os.environ.get(ENV)!r}): {why}. The model is NOT checked. "
               "Report it with `pip show vllm quantmatrix` output (docs/guard.md).")
    _LOG.error(message)
    print(message, file=sys.stderr, flush=True)
    if wanted == "refuse":
        raise GuardFailed(message)


def _install() -> None:
    from quantmatrix.adapter import engine
    from quantmatrix.guard.record import Recorder

    module, build_name, post_load_name = engine.loader_seams()
    build, post_load = getattr(module, build_name), getattr(module, post_load_name)
    recorders: dict[int, tuple[Recorder, float]] = {}

    @functools.wraps(build)
    def build_recorded(*args: Any, **kwargs: Any) -> Any:
        model = build(*args, **kwargs)
        if mode() is not None:
            start = time.perf_counter()
            recorder = Recorder()
            recorder.install(model)
            recorders[id(model)] = (recorder, time.perf_counter() - start)
        return model

    @functools.wraps(post_load)
    def judge_then_process(model: Any, model_config: Any, *args: Any, **kwargs: Any) -> Any:
        wanted = mode()
        entry = recorders.pop(id(model), None)
        if wanted is not None:
            if entry is None:
                _fail(wanted, f"the model reached {post_load_name} without passing {build_name}: the loader seam "
                              "moved (update quantmatrix/adapter/engine.py)")
            else:
                guard_model(entry[0], model_config, wanted, entry[1])
        return post_load(model, model_config, *args, **kwargs)

    setattr(module, build_name, build_recorded)
    setattr(module, post_load_name, judge_then_process)
    _LOG.info("quantmatrix guard installed (%s=%s) at %s.%s / %s", ENV, mode(), module.__name__, build_name,
              post_load_name)


def guard_model(recorder: Any, model_config: Any, wanted: str, hook_s: float = 0.0) -> Any:
    """Judge the recorded model; raise GuardRefusal (refuse) or log once (warn). Returns the Outcome."""
    from quantmatrix.adapter import declared, loaders
    from quantmatrix.guard import judge

    start = time.perf_counter()
    try:
        outcome = judge.judge(recorder, backends(), declared.of_model(model_config))
        text = judge.refusal(outcome, lambda prefix: loaders.model_files(model_config, prefix))
    except Exception as e:  # a guard bug must never look like a clean model
        _fail(wanted, f"judging the loaded model failed ({type(e).__name__}: {e})")
        return None
    finally:
        recorder.uninstall()
    took = time.perf_counter() - start + hook_s
    n = len(outcome.problems)
    _LOG.info("quantmatrix guard ran (%s): checked %d tensors in %d layers (%d MoE) in %.3f s; %d problem(s)",
              wanted, outcome.tensors, len(outcome.layers), sum(r.kind == "moe" for r in outcome.layers), took, n)
    if n and wanted == "refuse":
        raise GuardRefusal(f"quantmatrix guard refuses to serve {getattr(model_config, 'model', '?')}: {n} tensor "
                           f"problem(s) the selected kernels would read\n{text}")
    if n:
        _LOG.warning("quantmatrix guard (warn): %d tensor problem(s) the selected kernels read; serving anyway\n%s",
                     n, text)
    return outcome


@functools.cache
def backends() -> Any:
    """The packaged read-sets, with QUANTMATRIX_GUARD_BACKENDS's matrix moe_backends on top when set."""
    from quantmatrix.schema import backends as packaged

    path = os.environ.get(BACKENDS_ENV)
    if not path:
        return packaged.package_backends()
    from quantmatrix.schema.load import load

    return load(path).moe_backends
