"""gpt-oss's own weight loading (vLLM 0.32 models/gpt_oss.py): GptOssModel.load_weights, not the MoE block's
weight_loaders alone, maps the checkpoint's fused names (`gate_up_proj_blocks` -> `w13_weight`, through
GptOssForCausalLM.hf_to_vllm_mapper) and slices each fused MXFP4 tensor for the rank (`_load_weights_mxfp4`: w13
rows 2 x tp_rank x its part, w2 columns per 32 inputs, whole experts under expert parallel). The layer checks feed
a gpt-oss MLPBlock through that loader, with the block standing in for the model: a module holding it at
`layers.<i>.mlp`, as GptOssModel holds it, so that vLLM's own code names, slices and loads every tensor."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from quantmatrix.adapter.versions import Span, pick
from quantmatrix.errors import AdapterMismatch

BLOCK = "MLPBlock"  # gpt-oss's MoE block class (adapter.layers builds it)
_MODEL = "vllm.model_executor.models.gpt_oss"
# The GptOssModel methods its MXFP4 loader calls on itself, which the stand-in borrows: 0.32 also tries each
# tensor as a streamed single expert first (measured: 0.28.0 lacks the method, 0.32.0 and 0.34.0 call it; the
# releases between are unmeasured and fail loudly until someone looks).
_LOADER_METHODS = (Span(("load_weights", "_load_weights_mxfp4"), before="0.29.0"),
                   Span(("load_weights", "_load_weights_mxfp4", "_try_load_streamed_expert"), since="0.32.0"))


def owns(block: Any) -> bool:
    """Whether the block is gpt-oss's, whose tensors only GptOssModel's loader can load."""
    return type(block).__name__ == BLOCK and type(block).__module__ == _MODEL


def load(block: Any, prefix: str, vllm_config: Any, tensors: Iterable[tuple[str, Any]]) -> set[str]:
    """Feed checkpoint tensors (checkpoint names, under `prefix` = `model.layers.<i>.mlp.`) through GptOssModel's
    loader; returns the checkpoint names it loaded."""
    import importlib

    import torch

    model = importlib.import_module(_MODEL)
    parts = prefix.rstrip(".").split(".")
    if parts[:2] != ["model", "layers"] or len(parts) != 4 or not parts[2].isdigit():
        raise ValueError(f"{prefix!r} is not a gpt-oss block prefix (model.layers.<i>.mlp.)")

    methods = {}
    for name in pick("GptOssModel's MXFP4 loader methods", _LOADER_METHODS, "gpt_oss.py"):
        if not hasattr(model.GptOssModel, name):  # a helper moved: the stand-in would load nothing, silently
            raise AdapterMismatch(f"GptOssModel has no {name}: update quantmatrix/adapter/gpt_oss.py")
        methods[name] = getattr(model.GptOssModel, name)  # a classmethod stays bound to GptOssModel

    class StandIn(torch.nn.Module):
        """GptOssModel with only this block: its config and parallel config, its loader (`methods`)."""

        def __init__(self) -> None:
            super().__init__()
            self.config = vllm_config.model_config.hf_config
            self.parallel_config = vllm_config.parallel_config
            self.layers = torch.nn.ModuleDict({parts[2]: torch.nn.ModuleDict({parts[3]: block})})

    for name, method in methods.items():
        setattr(StandIn, name, method)

    local = f"layers.{parts[2]}.{parts[3]}."
    mapped = [(name.removeprefix("model."), t) for name, t in model.GptOssForCausalLM.hf_to_vllm_mapper.apply(
        (name, t) for name, t in tensors if name.startswith(prefix))]
    stand_in = StandIn()
    try:
        loaded = stand_in.load_weights(mapped)
    except AttributeError as e:  # the loader wants more of GptOssModel than the stand-in has: not a vLLM refusal
        if e.obj is stand_in or e.obj is StandIn:
            raise AdapterMismatch(f"gpt-oss's loader needs GptOssModel.{e.name}, which the stand-in lacks: update "
                                  "quantmatrix/adapter/gpt_oss.py") from e
        raise
    return {n.removeprefix(local) for n in loaded}


def corners(block: Any, experts: Any, hf_config: Any) -> dict[str, tuple[int, ...]]:
    """Per fused expert parameter (the block's own names), the corner of an expert row its loader fills: the
    checkpoint's extent before the MXFP4 method rounded hidden and intermediate up for its kernel
    (mxfp4_round_up_hidden_size_and_intermediate_size; `_copy_to_expert` writes the front corner only). The rest
    of the row is vLLM's padding, zeros from create_weights; {} where nothing is padded. vLLM's fused parameters
    are [experts, out, in-derived]: w13 rows scale with the intermediate size, their columns with the hidden size,
    w2 the other way round."""
    config = experts.moe_config.moe_parallel_config
    hidden, inter = int(hf_config.hidden_size), int(hf_config.intermediate_size) // int(config.tp_size)
    padded_hidden, padded_inter = int(experts.hidden_size), int(experts.intermediate_size_per_partition)
    if (hidden, inter) == (padded_hidden, padded_inter):
        return {}
    out = {}
    for name, p in block.named_parameters():
        last = name.rsplit(".", 1)[-1]
        if not last.startswith(("w13_", "w2_")) or p.dim() < 2:
            continue
        ratios = ((inter, padded_inter), (hidden, padded_hidden))
        if last.startswith("w2_"):
            ratios = ratios[::-1]
        out[name] = tuple(size * n // d for size, (n, d) in zip(p.shape[1:], ratios, strict=False))
    return out
