"""vLLM's own naming of MoE parameters: the fused expert prefixes (`w13_`, `w2_`, `.routed_experts`) around the
checkpoint's leaf names. Which role a leaf plays is the producers' table (checkpoints.producers.role_of)."""

from __future__ import annotations

import re

# vLLM's fused expert prefixes, and the fused projections a gpt-oss checkpoint names its tensors after
_FUSED_PREFIX = re.compile(r"w(13|2)_|(gate_up|down)_proj_")


def leaf(param_name: str) -> str:
    """The checkpoint leaf a parameter name carries: its last component, less a fused expert prefix
    (`w13_weight_scale` -> `weight_scale`, gpt-oss's `gate_up_proj_scales` -> `scales`)."""
    last = param_name.rsplit(".", 1)[-1]
    m = _FUSED_PREFIX.match(last)
    return last[m.end():] if m else last


# vLLM's fused expert parameters (…experts[.routed_experts].w13_<leaf> / w2_<leaf>) -> the checkpoint projections
# each expert row is loaded from, in both namings (Qwen/DeepSeek gate/up/down, Mixtral w1/w3/w2). The leaf after
# `w13_`/`w2_` is the checkpoint's own leaf for both producers (weight_scale_2, input_global_scale, ...).
_FUSED = re.compile(r"(?P<module>.+\.experts)(\.routed_experts)?\.(?P<fused>w13|w2)_(?P<leaf>\w+)")
# vLLM's shard ids (the weight_loader's shard_id) and the checkpoint projections each is loaded from; a fused
# parameter holds its shards in this order (w13: the gate rows first, then the up rows).
SHARDS = {"w1": ("gate_proj", "w1"), "w3": ("up_proj", "w3"), "w2": ("down_proj", "w2")}
FUSED_SHARDS = {"w13": ("w1", "w3"), "w2": ("w2",)}
_PROJECTIONS = {fused: tuple(SHARDS[s][naming] for naming in (0, 1) for s in shards)  # one naming, then the other
                for fused, shards in FUSED_SHARDS.items()}


def fused_parts(param_name: str) -> tuple[str, str, str] | None:
    """(the experts module's checkpoint prefix, `w13` or `w2`, the checkpoint leaf) of a fused expert parameter,
    None for any other parameter."""
    m = _FUSED.fullmatch(param_name)
    return (m["module"], m["fused"], m["leaf"]) if m else None


def is_fused_expert(param_name: str) -> bool:
    """Whether a parameter is one of vLLM's fused expert tensors (dim 0: the experts), by its name alone: what a
    record printed without vLLM (the H200 probe's PARAMS line) can be read by."""
    return _FUSED.fullmatch(param_name) is not None


# gpt-oss's fused checkpoint tensors (all experts in one; GptOssForCausalLM.hf_to_vllm_mapper): `w13_weight` is
# loaded from `gate_up_proj_blocks`, `w2_weight_scale` from `down_proj_scales`, ...
_GPT_OSS_PROJECTIONS = {"w13": "gate_up_proj", "w2": "down_proj"}
_GPT_OSS_LEAVES = {"weight": "blocks", "weight_scale": "scales", "bias": "bias"}


def fused_checkpoint_name(module: str, fused: str, leaf: str) -> str | None:
    """gpt-oss's one checkpoint tensor (every expert) that fused parameter `<module>.<fused>_<leaf>` is loaded from,
    None for a leaf gpt-oss does not store."""
    return f"{module}.{_GPT_OSS_PROJECTIONS[fused]}_{_GPT_OSS_LEAVES[leaf]}" if leaf in _GPT_OSS_LEAVES else None


def checkpoint_names(param_name: str, experts: tuple[int, ...]) -> tuple[str, ...]:
    """The parameter's own name, then the checkpoint tensors its expert rows `experts` are loaded from (a fused
    parameter: every projection it fuses, in both namings, and gpt-oss's fused tensor); any other parameter is only
    its own name."""
    m = _FUSED.fullmatch(param_name)
    if m is None:
        return (param_name,)
    fused = fused_checkpoint_name(m["module"], m["fused"], m["leaf"])
    return (param_name, *(f"{m['module']}.{e}.{proj}.{m['leaf']}" for e in experts
                          for proj in _PROJECTIONS[m["fused"]]), *((fused,) if fused else ()))
