"""Inside a running engine: where vLLM builds and post-processes a model (the poison plugin's seams), what its
MoE layers selected, and the engine's inputs and outputs as plain data."""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Callable
from typing import Any

from quantmatrix.adapter.versions import versions
from quantmatrix.errors import AdapterMismatch

# Where vLLM builds a model and where it turns loaded weights into kernel format (BaseModelLoader.load_model
# calls both by these module-level names, with load_weights in between).
_LOADER_MODULE = "vllm.model_executor.model_loader.base_loader"
_BUILD, _POST_LOAD = "initialize_model", "process_weights_after_loading"
# What an engine start imports, for the vLLM health check (adapter.health); the engine tier's children import
# `vllm` (LLM, SamplingParams) and the loader seams.
MODULES = ("vllm", "vllm.entrypoints.llm", _LOADER_MODULE)
# The layer that owns the experts' weights and their quant method (0.32: RoutedExperts, inside a MoERunner).
MOE_LAYER_CLASSES = ("RoutedExperts",)
# The entry-point group vLLM loads general plugins from (pyproject's quantmatrix_poison and quantmatrix_guard), and
# the logger vLLM configures handlers on: a plugin's child logger of it writes into vLLM's own log.
PLUGIN_GROUP = "vllm.general_plugins"
_LOGGER = "vllm"


def plugin_logger(name: str) -> logging.Logger:
    """A plugin's logger whose lines land in vLLM's own log (a child of the logger vLLM configures)."""
    return logging.getLogger(f"{_LOGGER}.{name}")


def loader_seams() -> tuple[Any, str, str]:
    """(module, build function name, post-load function name) for the poison plugin."""
    import importlib

    try:
        module = importlib.import_module(_LOADER_MODULE)
    except ImportError as e:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: {_LOADER_MODULE} is gone ({e}); update "
                              "quantmatrix/adapter/engine.py") from e
    missing = [n for n in (_BUILD, _POST_LOAD) if not callable(getattr(module, n, None))]
    if missing:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: {_LOADER_MODULE} has no {', '.join(missing)}; "
                              "the poison seam moved: update quantmatrix/adapter/engine.py")
    return module, _BUILD, _POST_LOAD


def is_moe_layer(module: Any) -> bool:
    return type(module).__name__ in MOE_LAYER_CLASSES


def backend_of(quant_method: Any) -> tuple[str | None, str | None]:
    """The MoE backend a quant method selected: the enum stored next to `experts_cls` (nvfp4_backend,
    unquantized_backend, fp8_backend, ...). (attribute, value) or (None, None) when it keeps none."""
    import enum

    for attr, value in vars(quant_method).items():
        if (attr == "backend" or attr.endswith("_backend")) and isinstance(value, enum.Enum):
            return attr, value.name
    return None, None


def moe_layer_facts(model: Any) -> dict[str, dict[str, Any]]:
    """Per MoE layer of a live model: quant method class, the backend it selected, the experts class."""
    out: dict[str, dict[str, Any]] = {}
    for name, module in model.named_modules():
        if not is_moe_layer(module):
            continue
        qm = getattr(module, "quant_method", None)
        if qm is None:
            raise AdapterMismatch(f"{name} ({type(module).__name__}) has no quant_method: update "
                                  "quantmatrix/adapter/engine.py")
        wrapped = getattr(qm, "old_quant_method", None)  # a modular kernel wraps the method it replaced
        source = wrapped if wrapped is not None else qm
        attr, backend = backend_of(source)
        experts = getattr(source, "experts_cls", None)
        out[name] = {"quant_method": type(source).__name__, "runtime_method": type(qm).__name__,
                     "backend": backend, "backend_attr": attr,
                     "experts_cls": getattr(experts, "__name__", None),
                     "parameters": {n: {"shape": list(p.shape), "dtype": str(p.dtype).removeprefix("torch.")}
                                    for n, p in module.named_parameters(recurse=False)}}
    if not out and any(".experts" in n for n, _ in model.named_modules()):
        raise AdapterMismatch(f"the model has expert modules but none of class {MOE_LAYER_CLASSES}: update "
                              "quantmatrix/adapter/engine.py")
    return out


def on_every_worker(llm: Any, fn: Callable[[Any], dict[str, Any]]) -> list[dict[str, Any]]:
    """fn(model) on every worker of a live LLM (0.32: apply_model, which cloudpickles the function and so needs
    VLLM_ALLOW_INSECURE_SERIALIZATION=1 when the engine core is another process: engine.protocol sets it)."""
    if not hasattr(llm, "apply_model"):
        raise AdapterMismatch("vllm.LLM has no apply_model: update quantmatrix/adapter/engine.py")
    return list(llm.apply_model(fn))


def import_engine() -> None:
    """Import vLLM's engine (the slow part of an engine child's start, timed on its own)."""
    import vllm

    if not callable(getattr(vllm, "LLM", None)):
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']} has no vllm.LLM: update "
                              "quantmatrix/adapter/engine.py")


def start(model: str, engine_args: dict[str, Any]) -> Any:
    """A live engine (vllm.LLM) for a checkpoint, with the run's engine arguments."""
    import vllm

    return vllm.LLM(model=model, **engine_args)


def generate(llm: Any, prompts: list[str], max_tokens: int, logprobs: int) -> list[dict[str, Any]]:
    """Greedy continuations of `prompts` (sampling_params) as plain data (completions), without a progress bar."""
    return completions(llm.generate(prompts, sampling_params(max_tokens, logprobs), use_tqdm=False))


def sampling_params(max_tokens: int, logprobs: int) -> Any:
    """Greedy, a fixed length (EOS ignored, so every run scores the same positions), top-k logprobs."""
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=logprobs, ignore_eos=True)


def _finite(x: float) -> float | None:
    return x if x == x and x not in (float("inf"), float("-inf")) else None


def completions(request_outputs: list[Any]) -> list[dict[str, Any]]:
    """vLLM RequestOutputs as plain data: token ids, text, and per position {token id: logprob} of the top-k
    (non-finite logprobs become None: JSON has no NaN, and a NaN logprob is itself the finding)."""
    out = []
    for ro in request_outputs:
        c = ro.outputs[0]
        positions = []
        for step in c.logprobs or []:
            positions.append({str(tok): _finite(float(lp.logprob)) for tok, lp in step.items()})
        out.append({"prompt_token_ids": list(ro.prompt_token_ids), "text": c.text,
                    "token_ids": list(c.token_ids), "logprobs": positions})
    return out


def device() -> dict[str, Any]:
    """The device the engine ran on, from torch in the child (cuda:0 after CUDA_VISIBLE_DEVICES pinning)."""
    import torch

    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability(0)
        return {"name": torch.cuda.get_device_name(0), "capability": f"{cap[0]}.{cap[1]}",
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    return {"name": f"cpu ({platform.processor() or platform.machine()})", "capability": None,
            "cuda_visible_devices": None}


def timed_model_loads(sink: list[float]) -> None:
    """Append the wall time of every model load in this process (BaseModelLoader.load_model: build, load weights,
    post-process) to `sink`: what bench/bench_guard.py compares with and without the guard."""
    import functools
    import importlib
    import time

    cls = getattr(importlib.import_module(_LOADER_MODULE), "BaseModelLoader", None)
    if cls is None or not callable(getattr(cls, "load_model", None)):
        raise AdapterMismatch(f"{_LOADER_MODULE}.BaseModelLoader.load_model is gone: update "
                              "quantmatrix/adapter/engine.py")
    load_model = cls.load_model

    @functools.wraps(load_model)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return load_model(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - start)

    cls.load_model = timed


# Every loader vLLM offers (its load-format registry lives in this package, which imports them all); some import
# initialize_model / process_weights_after_loading by name into their own module (tensorizer, ipc_cache), so a seam
# patched only in base_loader is never passed under them.
_LOADER_PACKAGE = "vllm.model_executor.model_loader"


def seam_copies(build: Any, post_load: Any) -> list[Any]:
    """Every imported module of vLLM's model_loader package holding `build` or `post_load` (the originals) under
    their own names: where the guard must patch them so that every load format passes its seams."""
    import importlib
    import sys

    importlib.import_module(_LOADER_PACKAGE)  # the registry: every loader module imported
    return [m for name, m in list(sys.modules.items()) if m is not None and name.startswith(_LOADER_PACKAGE)
            and (getattr(m, _BUILD, None) is build or getattr(m, _POST_LOAD, None) is post_load)]


def wrap_loaders(wrap: Callable[[Callable[..., Any], str], Callable[..., Any]]) -> int:
    """Replace the load_model of every loader class (loader_classes) by wrap(its load_model, class name): what
    every load format vLLM offers runs to load a model. Returns how many were wrapped."""
    classes = loader_classes()
    for cls in classes:
        cls.load_model = wrap(cls.load_model, cls.__name__)
    return len(classes)


def loader_classes() -> list[type]:
    """BaseModelLoader and every subclass of it that defines its own load_model (each load format's entry)."""
    import importlib

    importlib.import_module(_LOADER_PACKAGE)
    base = getattr(importlib.import_module(_LOADER_MODULE), "BaseModelLoader", None)
    if base is None:
        raise AdapterMismatch(f"{_LOADER_MODULE}.BaseModelLoader is gone: update quantmatrix/adapter/engine.py")
    out, todo = [], [base]
    while todo:
        cls = todo.pop()
        if "load_model" in vars(cls):
            out.append(cls)
        todo.extend(cls.__subclasses__())
    return out
