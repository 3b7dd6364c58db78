"""vLLM's own MoE blocks built on a CPU host for a checkpoint, under a simulated capability, and fed through
vLLM's own weight loaders: what the layer-level checks (dispatch, audit, kernel format) look at."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quantmatrix.adapter import config, simulate
from quantmatrix.errors import AdapterMismatch

# model_type -> (module, block class, submodule name of the MoE block in a decoder layer)
_MOE_BLOCKS = {
    "qwen3_moe": ("vllm.model_executor.models.qwen3_moe", "Qwen3MoeSparseMoeBlock", "mlp"),
    "mixtral": ("vllm.model_executor.models.mixtral", "MixtralMoE", "block_sparse_moe"),
}
_PRE_IMPORTS = (
    *config.QUANT_MODULES,
    "vllm.model_executor.layers.quantization.online.base",
    "vllm.model_executor.models.utils",
    *(m for m, _, _ in _MOE_BLOCKS.values()),
)
# What building a layer imports, for the vLLM health check (adapter.health): the above, the parallel groups and
# the platform the capability simulation patches.
MODULES = (*_PRE_IMPORTS, "vllm.distributed", "vllm.platforms", "vllm.utils.torch_utils")


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


def prepare(checkpoint_dir: Path) -> Any:
    """Import everything capability-sensitive and parse the model config BEFORE the platform is patched."""
    import importlib

    for module in _PRE_IMPORTS:
        importlib.import_module(module)
    return config.model_config(checkpoint_dir)


def build_moe_layer(model_config: Any, layer_index: int = 0) -> MoELayer:
    """Build the MoE block vLLM's model class builds for this checkpoint; call inside simulate.simulate."""
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
        raise AdapterMismatch(f"MoE method {name} has no use_a16: update quantmatrix/adapter/layers.py")
    return bool(method.use_a16)


@dataclasses.dataclass
class LayerBuild:
    """A built MoE layer, or why vLLM refused to build it (refusing can be the expected outcome)."""

    layer: MoELayer | None
    error: str | None
    layers: list[MoELayer] = dataclasses.field(default_factory=list)  # every MoE layer, when asked for


def build(checkpoint_dir: Path, capability: tuple[int, int], every_layer: bool = False) -> LayerBuild:
    """vLLM's own MoE block for the checkpoint (the first, or every one), built as on `capability`."""
    try:
        model_config = prepare(checkpoint_dir)
        indices = moe_layer_indices(model_config)
        with simulate.simulate(capability):
            layers = [build_moe_layer(model_config, i) for i in (indices if every_layer else indices[:1])]
        return LayerBuild(layers[0], None, layers)
    except AdapterMismatch:
        raise
    except (ValueError, NotImplementedError, RuntimeError, KeyError, TypeError) as e:
        return LayerBuild(None, config.reason(e))
