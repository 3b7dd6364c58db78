"""The config files every synthetic checkpoint shares, whoever produced it: the tiny model's config.json and
generation_config.json, and the producer-neutral meaning of the config flags (which modules stay bf16, the
config_groups shape). A producer module (checkpoints.producers) adds its own declaration on top.
"""

from __future__ import annotations

from typing import Any

from quantmatrix.schema.synthetic import SyntheticSpec

_SIZES = {
    "cpu_tiny": {"hidden": 64, "expert_ffn": 64, "dense_ffn": 128},
    "gpu_tiny": {"hidden": 128, "expert_ffn": 128, "dense_ffn": 256},
    "block_tiny": {"hidden": 256, "expert_ffn": 256, "dense_ffn": 512},
}
_GENERATION = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}


def model_config(model: str, size: str) -> dict[str, Any]:
    """The HF config.json of the tiny MoE model (head_dim 64: vLLM's CPU attention rejects 16)."""
    s = _SIZES[size]
    common = {
        "hidden_size": s["hidden"],
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "vocab_size": 1024,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "initializer_range": 0.02,
    }
    if model == "gpt_oss":
        return _gpt_oss(common, s)
    if model == "qwen3_moe":
        return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **common,
                "intermediate_size": s["dense_ffn"], "moe_intermediate_size": s["expert_ffn"],
                "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
                "norm_topk_prob": True, "mlp_only_layers": [], "attention_bias": False}
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", **common,
            "intermediate_size": s["expert_ffn"], "num_local_experts": 4, "num_experts_per_tok": 2,
            "sliding_window": None}


def _gpt_oss(common: dict[str, Any], s: dict[str, int]) -> dict[str, Any]:
    """gpt-oss in miniature: fused experts with biases, attention sinks and biases, a sliding window on every
    other layer, yarn rope (vLLM's GptOssAttention reads its yarn parameters unconditionally; factor x original
    length = max_position_embeddings, as transformers wants it)."""
    rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": common["max_position_embeddings"] // 4}
    return {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
            **{k: v for k, v in common.items() if k != "rope_theta"}, "intermediate_size": s["expert_ffn"],
            "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 128,
            "layer_types": ["sliding_attention", "full_attention"], "rope_parameters": rope, "attention_bias": True,
            "swiglu_limit": 7.0, "router_aux_loss_coef": 0.0, "output_router_logits": False}


def plain_files(model: str, size: str) -> dict[str, dict[str, Any]]:
    """File name -> JSON content of the config files of the model before any producer declares a quantization."""
    return {"config.json": model_config(model, size), "generation_config.json": dict(_GENERATION)}


def excluded_modules(spec: SyntheticSpec) -> list[str]:
    """Modules left in bf16, as globs over HF module names (a producer rewrites them in its own pattern syntax)."""
    router = {"qwen3_moe": "model.layers.*.mlp.gate", "gpt_oss": "model.layers.*.mlp.router"}.get(
        spec.model, "model.layers.*.block_sparse_moe.gate")
    names = ["lm_head", router]
    if spec.quantize == "experts":
        names.append("model.layers.*.self_attn*")
    return names


def config_groups(spec: SyntheticSpec, group: dict[str, Any]) -> dict[str, Any] | None:
    """The config_groups the spec asks for around one group: present, empty, or missing (None: leave the key out)."""
    return {"present": {"group_0": group}, "empty": {}, "missing": None}[spec.config_groups]
