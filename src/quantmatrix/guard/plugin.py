"""The vLLM general plugin `quantmatrix_guard` (entry point quantmatrix.guard.plugin:register; vLLM calls it in every
process that may load weights: EngineCore, each worker, every tensor-parallel rank).

Inactive unless QUANTMATRIX_GUARD is set: `warn` logs the refusal once, with a count, and serves; any other
non-empty value means `refuse` and stops the engine before it serves. Right after vLLM builds the model the guard
wraps the MoE and linear parameters' weight_loaders (guard.record); right before `process_weights_after_loading`
turns the loaded tensors into kernel format it judges them (guard.judge) and unwraps. Nothing stays on the forward
path. Either way vLLM's log says that the guard ran and how many tensors it checked; a guard that cannot run says so
at ERROR level and, under `refuse`, stops the engine too (vLLM itself only logs a plugin that fails to import, so
this module imports nothing but the standard library, quantmatrix.engine.protocol and quantmatrix.adapter.engine,
both standard library only at import, until `register` runs). A load the guard did not judge, under any load format,
fails the same way (refuse) or logs an ERROR (warn).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from typing import Any

from quantmatrix.adapter.engine import plugin_logger
from quantmatrix.engine.protocol import GUARD_RAN

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
    judged: set[int] = set()

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
                if guard_model(entry[0], model_config, wanted, entry[1]) is not None:
                    judged.add(id(model))
        return post_load(model, model_config, *args, **kwargs)

    seams = engine.seam_copies(build, post_load) or [module]
    for m in seams:
        for name, original, wrapper in ((build_name, build, build_recorded),
                                        (post_load_name, post_load, judge_then_process)):
            if getattr(m, name, None) is original:
                setattr(m, name, wrapper)
    engine.wrap_loaders(functools.partial(_checked_load, judged=judged))
    _LOG.info("quantmatrix guard installed (%s=%s) at %s.%s / %s in %d loader module(s)", ENV, mode(),
              module.__name__, build_name, post_load_name, len(seams))


_depth = threading.local()


def _checked_load(load_model: Any, loader: str, judged: set[int]) -> Any:
    """A load format's model loading that, once the outermost load returns, fails (refuse) or logs an ERROR (warn)
    when the model it loaded was never judged: a loader that builds or post-processes the model by a path the
    guard's seams do not reach (ipc_cache's zero-copy mode skips post-processing) is never served as checked."""

    @functools.wraps(load_model)
    def checked(*args: Any, **kwargs: Any) -> Any:
        _depth.n = getattr(_depth, "n", 0) + 1
        try:
            model = load_model(*args, **kwargs)
        finally:
            _depth.n -= 1
        wanted = mode()
        if _depth.n == 0 and wanted is not None:
            if id(model) in judged:
                judged.discard(id(model))
            else:
                _fail(wanted, f"{loader} loaded the model without the guard judging it (this load format "
                              "builds or post-processes the model where the guard's seams are not)")
        return model

    return checked


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
    layers = [r for r in outcome.layers if r.kind != "other"]
    direct = (" (the load format wrote param.data directly, no weight_loader ran: what was never loaded is not "
              "measured, every value is judged)") if outcome.direct else ""
    _LOG.info(GUARD_RAN + "%s): checked %d tensors in %d layers (%d MoE) in %.3f s; %d problem(s)%s",
              wanted, outcome.tensors, len(layers), sum(r.kind == "moe" for r in layers), took, n, direct)
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
    from quantmatrix.schema.overrides import override_file

    return override_file(path)
