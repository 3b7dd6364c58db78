"""The gpt-oss family's bf16 tensors, in transformers' names: its experts are fused per layer (no Linear per
expert), so the per-expert tables of checkpoints.base do not describe it.

`mlp.experts.gate_up_proj` [E, hidden, 2*ffn] holds gate and up interleaved along its last dim (gate at even,
up at odd columns: GptOssExperts._apply_gate), `mlp.experts.down_proj` [E, ffn, hidden], each with a bias per
expert; the router is a Linear with a bias (`mlp.router`), attention has biases and one sink logit per head.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

MODEL = "gpt_oss"
EXPERTS = "mlp.experts"  # the module that holds a layer's fused experts
PROJECTIONS = ("gate_up_proj", "down_proj")  # the fused expert weights, as HF names them
Normal = Callable[[str, tuple[int, ...], float], torch.Tensor]  # (tensor name, shape, std) -> seeded bf16 values


def experts_module(layer: int) -> str:
    return f"model.layers.{layer}.{EXPERTS}"


def tensors(config: dict[str, Any], normal: Normal) -> dict[str, torch.Tensor]:
    """HF-named bf16 state dict; weights with std 1/sqrt(fan_in) (as the other families), biases and sinks
    small, so the swiglu clamp (limit 7) never bites."""
    hidden, ffn, experts = config["hidden_size"], config["intermediate_size"], config["num_local_experts"]
    heads, kv, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    ones = functools.partial(torch.ones, dtype=torch.bfloat16)
    t = {"model.embed_tokens.weight": normal("embed", (config["vocab_size"], hidden), 1.0),
         "lm_head.weight": normal("lm_head", (config["vocab_size"], hidden), 1 / math.sqrt(hidden)),
         "model.norm.weight": ones(hidden)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        for proj, out, inp in (("q_proj", heads * head_dim, hidden), ("k_proj", kv * head_dim, hidden),
                               ("v_proj", kv * head_dim, hidden), ("o_proj", hidden, heads * head_dim)):
            t[f"{p}.self_attn.{proj}.weight"] = normal(f"{p}.self_attn.{proj}", (out, inp), 1 / math.sqrt(inp))
            t[f"{p}.self_attn.{proj}.bias"] = normal(f"{p}.self_attn.{proj}.bias", (out,), 0.02)
        t[f"{p}.self_attn.sinks"] = normal(f"{p}.self_attn.sinks", (heads,), 0.5)
        t[f"{p}.mlp.router.weight"] = normal(f"{p}.mlp.router", (experts, hidden), 1 / math.sqrt(hidden))
        t[f"{p}.mlp.router.bias"] = normal(f"{p}.mlp.router.bias", (experts,), 0.02)
        e = experts_module(layer)
        t[f"{e}.gate_up_proj"] = normal(f"{e}.gate_up_proj", (experts, hidden, 2 * ffn), 1 / math.sqrt(hidden))
        t[f"{e}.gate_up_proj_bias"] = normal(f"{e}.gate_up_proj_bias", (experts, 2 * ffn), 0.02)
        t[f"{e}.down_proj"] = normal(f"{e}.down_proj", (experts, ffn, hidden), 1 / math.sqrt(ffn))
        t[f"{e}.down_proj_bias"] = normal(f"{e}.down_proj_bias", (experts, hidden), 0.02)
        t[f"{p}.input_layernorm.weight"] = ones(hidden)
        t[f"{p}.post_attention_layernorm.weight"] = ones(hidden)
    return dict(sorted(t.items()))
