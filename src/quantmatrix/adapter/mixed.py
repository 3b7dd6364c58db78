"""ModelOpt MIXED_PRECISION per projection: the linear method vLLM's resolved config builds for each attention
projection, router and lm_head of a checkpoint, beside the algo the checkpoint's `quantized_layers` declares for
the HF modules it fuses (q/k/v into qkv_proj).

vLLM looks each layer's algo up by its own module name (ModelOptMixedPrecisionConfig._resolve_quant_algo: direct,
through the model's packed_modules_mapping, by prefix, by unfused shard names); a lookup that misses builds the
layer unquantized, without a word, and the checkpoint's scales are never loaded. The experts' method is the MoE
layer's (adapter.layers builds it for layer_dispatch).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from typing import Any

from quantmatrix.adapter.declared import MODELOPT_ALGOS, mixed_layers, quantization_config
from quantmatrix.errors import AdapterMismatch

# vLLM's linear modules of a decoder layer: (suffix, vLLM class, the HF modules it loads); {moe} is the MoE block
_LINEARS = (("self_attn.qkv_proj", "QKVParallelLinear", ("q_proj", "k_proj", "v_proj")),
            ("self_attn.o_proj", "RowParallelLinear", ("o_proj",)),
            ("{moe}.gate", "ReplicatedLinear", ("gate",)))
_MOE = {"qwen3_moe": "mlp", "mixtral": "block_sparse_moe"}
# what the per-projection reading imports, for the vLLM health check (adapter.config.MIXED_MODULES)
MIXED_MODULES = ("vllm.model_executor.layers.linear", "vllm.model_executor.layers.vocab_parallel_embedding",
           "vllm.model_executor.model_loader.utils")
_CLASSES = {"QKVParallelLinear": "vllm.model_executor.layers.linear",
            "RowParallelLinear": "vllm.model_executor.layers.linear",
            "ReplicatedLinear": "vllm.model_executor.layers.linear",
            "ParallelLMHead": "vllm.model_executor.layers.vocab_parallel_embedding"}


# linear method classes that say what they run by their name alone (one per algo up to vLLM 0.28; 0.32 keeps only
# the unquantized one apart from its generic ModelOptLinearMethod)
_BY_CLASS = {"UnquantizedLinearMethod": "unquantized", "ModelOptFp8LinearMethod": "fp8_static",
             "ModelOptFp8PcPtLinearMethod": "fp8_dynamic", "ModelOptFp8PbWoLinearMethod": "fp8_block",
             "ModelOptNvFp4LinearMethod": "w4a4", "ModelOptNvFp4W4A16LinearMethod": "weight_only"}


@dataclasses.dataclass(frozen=True)
class Projection:
    """One vLLM linear module of a MIXED_PRECISION checkpoint, as declared and as built."""

    prefix: str  # vLLM's module name
    modules: tuple[str, ...]  # the HF modules it loads
    declared: str  # a resolves_to word of the map's algo for them ("unquantized": none listed, or ignored)
    built: str  # the same words for the method vLLM built
    method: str  # vLLM's method class

    def describe(self) -> str:
        return f"{self.prefix}={self.built} ({self.method})"


def _cls(name: str) -> type:
    import importlib

    try:
        return getattr(importlib.import_module(_CLASSES[name]), name)
    except (ImportError, AttributeError) as e:
        raise AdapterMismatch(f"vLLM's {name} moved ({e}): update quantmatrix/adapter/mixed.py") from e


def _built(method: Any) -> str:
    """What a linear method runs: UnquantizedLinearMethod, a method per algo (vLLM before its QuantSpec method:
    0.28), or ModelOptLinearMethod by its QuantSpec's keys."""
    import torch

    name = type(method).__name__
    if name in _BY_CLASS:
        return _BY_CLASS[name]
    spec = getattr(method, "spec", None)
    weight, acts = getattr(spec, "weight", None), getattr(spec, "activation", "?")
    if name != "ModelOptLinearMethod" or weight is None or acts == "?":
        raise AdapterMismatch(f"MIXED_PRECISION linear method {name} has no QuantSpec quantmatrix can read: update "
                              "quantmatrix/adapter/mixed.py")
    if weight.dtype == torch.uint8:
        return "weight_only" if acts is None else "w4a4"
    if acts is not None and acts.scale.static:
        return "fp8_static"
    return "fp8_block" if tuple(weight.scale.group_shape) == (128, 128) else "fp8_dynamic"


def _declared(modules: tuple[str, ...], layers: Mapping[str, str], ignore: list[str]) -> str:
    """The map's word for the HF modules one vLLM module loads (one algo for all, as vLLM requires)."""
    if any(fnmatch.fnmatchcase(m, p) or m == p or m.startswith(p + ".") for m in modules for p in ignore):
        return "unquantized"
    algos = {layers[m] for m in modules if m in layers}
    if not algos:
        return "unquantized"
    return "/".join(sorted(MODELOPT_ALGOS.get(a, a) for a in algos))


def _mixed_ignore(qc: Mapping[str, Any]) -> list[str]:
    inner = qc.get("quantization")
    value = inner.get("exclude_modules") if isinstance(inner, Mapping) else qc.get("ignore")
    return [p for p in value or () if isinstance(p, str)]


def projections(config: Any, model_config: Any) -> tuple[Projection, ...]:
    """Every linear module vLLM builds for the model outside its experts, declared and built."""
    from vllm.model_executor.model_loader.utils import get_model_architecture

    qc = quantization_config(model_config) or {}
    layers, ignore = dict(mixed_layers(qc)), _mixed_ignore(qc)
    # what SupportsQuant / configure_quant_config hand the config before the model is built
    config.packed_modules_mapping = dict(getattr(get_model_architecture(model_config)[0],
                                                 "packed_modules_mapping", None) or {})
    hf = model_config.hf_text_config
    moe = _MOE.get(hf.model_type)
    if moe is None:
        raise AdapterMismatch(f"no MoE block known for model_type {hf.model_type!r}: update "
                              "quantmatrix/adapter/mixed.py")
    rows = [(f"model.layers.{i}.{suffix.format(moe=moe)}", cls, tuple(
        f"model.layers.{i}.{suffix.format(moe=moe).rpartition('.')[0]}.{s}" for s in shards))
        for i in range(hf.num_hidden_layers) for suffix, cls, shards in _LINEARS]
    out = []
    with _current(model_config):
        for prefix, cls_name, modules in [*rows, ("lm_head", "ParallelLMHead", ("lm_head",))]:
            cls = _cls(cls_name)
            method = config.get_quant_method(cls.__new__(cls), prefix)
            out.append(Projection(prefix, modules, _declared(modules, layers, ignore), _built(method),
                                  type(method).__name__))
    return tuple(out)


def _current(model_config: Any) -> Any:
    """The config context vLLM builds layers in (0.28's linear methods read it when they are made)."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    return set_current_vllm_config(VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu")))
