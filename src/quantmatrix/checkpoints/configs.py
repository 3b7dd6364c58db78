"""Config files of synthetic checkpoints, exactly as each producer writes them.

The spec and its flags are the matrix's (schema.synthetic); this module writes what each flag means.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from quantmatrix.schema.synthetic import SyntheticSpec

# Bumped whenever the factory writes different bytes for the same spec (invalidates the cache).
FACTORY_VERSION = 2

MODELOPT_VERSION = "0.37.0"
_SIZES = {
    "cpu_tiny": {"hidden": 64, "expert_ffn": 64, "dense_ffn": 128},
    "gpu_tiny": {"hidden": 128, "expert_ffn": 128, "dense_ffn": 256},
}


def digest(spec: SyntheticSpec) -> str:
    """The cache key of a spec: its fields and the factory version that writes its bytes."""
    blob = json.dumps({"spec": dataclasses.asdict(spec), "factory": FACTORY_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def model_config(spec: SyntheticSpec) -> dict[str, Any]:
    """The HF config.json of the tiny MoE model (head_dim 64: vLLM's CPU attention rejects 16)."""
    s = _SIZES[spec.size]
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
    if spec.model == "qwen3_moe":
        return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **common,
                "intermediate_size": s["dense_ffn"], "moe_intermediate_size": s["expert_ffn"],
                "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
                "norm_topk_prob": True, "mlp_only_layers": [], "attention_bias": False}
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", **common,
            "intermediate_size": s["expert_ffn"], "num_local_experts": 4, "num_experts_per_tok": 2,
            "sliding_window": None}


def excluded_modules(spec: SyntheticSpec) -> list[str]:
    """Modules left in bf16, in the producer's own pattern syntax."""
    router = "model.layers.*.mlp.gate" if spec.model == "qwen3_moe" else "model.layers.*.block_sparse_moe.gate"
    names = ["lm_head", router]
    if spec.quantize == "experts":
        names.append("model.layers.*.self_attn*")
    if spec.producer == "compressed-tensors":  # regexes, as llm-compressor writes them
        return [n if "*" not in n else "re:" + n.replace(".", r"\.").replace("*", ".*") for n in names]
    return names


def _modelopt_group(spec: SyntheticSpec) -> dict[str, Any]:
    fp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    group: dict[str, Any] = {"weights": dict(fp4), "targets": ["Linear"]}
    acts = spec.activations
    if acts == "quantized":
        group["input_activations"] = dict(fp4)
    elif acts == "null":
        group["input_activations"] = None
    elif acts == "empty":
        group["input_activations"] = {}
    return group


def _groups(spec: SyntheticSpec, group: dict[str, Any]) -> dict[str, Any] | None:
    return {"present": {"group_0": group}, "empty": {}, "missing": None}[spec.config_groups]


def _modelopt_algo(spec: SyntheticSpec) -> str:
    return spec.quant_algo or "NVFP4"


def modelopt_quantization_config(spec: SyntheticSpec) -> dict[str, Any]:
    """config.json `quantization_config` as ModelOpt's unified HF exporter writes it."""
    qc: dict[str, Any] = {
        "quant_method": "modelopt",
        "quant_algo": _modelopt_algo(spec),
        "producer": {"name": "modelopt", "version": MODELOPT_VERSION},
        "ignore": excluded_modules(spec),
    }
    groups = _groups(spec, _modelopt_group(spec))
    if groups is not None:
        qc["config_groups"] = groups
    return qc


def modelopt_hf_quant_config(spec: SyntheticSpec) -> dict[str, Any]:
    """Legacy hf_quant_config.json: no config_groups, so it cannot say "weight-only" except by quant_algo."""
    return {
        "producer": {"name": "modelopt", "version": MODELOPT_VERSION},
        "quantization": {
            "quant_algo": _modelopt_algo(spec),
            "kv_cache_quant_algo": None,
            "group_size": 16,
            "exclude_modules": excluded_modules(spec),
        },
    }


def compressed_tensors_quantization_config(spec: SyntheticSpec) -> dict[str, Any]:
    """`quantization_config` built by the compressed-tensors package itself (NVFP4 / NVFP4A16 presets)."""
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    scheme = preset_name_to_scheme("NVFP4" if spec.activations == "quantized" else "NVFP4A16", ["Linear"])
    qc = QuantizationConfig(config_groups={"group_0": scheme}, ignore=excluded_modules(spec),
                            format="nvfp4-pack-quantized", quantization_status="compressed")
    out = qc.model_dump(mode="json")
    group = out["config_groups"]["group_0"]
    if spec.activations == "missing":
        del group["input_activations"]
    elif spec.activations == "empty":
        group["input_activations"] = {}
    groups = _groups(spec, group)
    if groups is None:
        del out["config_groups"]
    else:
        out["config_groups"] = groups
    return out


def config_files(spec: SyntheticSpec) -> dict[str, dict[str, Any]]:
    """File name -> JSON content of every config file of the checkpoint."""
    cfg = model_config(spec)
    files: dict[str, dict[str, Any]] = {}
    if spec.scheme != "bf16":
        if spec.producer == "modelopt" and spec.form == "legacy":
            files["hf_quant_config.json"] = modelopt_hf_quant_config(spec)
        elif spec.producer == "modelopt":
            cfg["quantization_config"] = modelopt_quantization_config(spec)
        elif spec.producer == "compressed-tensors":
            cfg["quantization_config"] = compressed_tensors_quantization_config(spec)
    files["config.json"] = cfg
    files["generation_config.json"] = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}
    return files
