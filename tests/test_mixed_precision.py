"""ModelOpt MIXED_PRECISION (nvidia/Qwen3.6-35B-A3B-NVFP4's format): vLLM's own config class, built from a
quantization config as the checkpoint carries it, is classified by the algo of its MoE experts - W4A16_NVFP4
experts are the seed bug's weight-only shape, whatever FP8 the attention uses."""

from __future__ import annotations

import pytest

from quantmatrix.adapter import config
from quantmatrix.errors import AdapterMismatch

pytest.importorskip("vllm")


def _mixed(layers: dict[str, dict[str, object]]) -> object:
    from vllm.model_executor.layers.quantization import get_quantization_config

    cls = get_quantization_config("modelopt_mixed")
    return cls.from_config({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
                            "quantized_layers": layers})


ATTN = {"quant_algo": "FP8"}


@pytest.mark.parametrize(("expert_algo", "scheme"), [("W4A16_NVFP4", "weight_only"), ("NVFP4", "w4a4")])
def test_mixed_precision_is_classified_by_its_experts(expert_algo, scheme):
    got = _mixed({"model.layers.0.self_attn.qkv_proj": ATTN,
                  "model.layers.0.mlp.experts": {"quant_algo": expert_algo, "group_size": 16}})
    assert config.classify(got) == (f"MIXED_PRECISION experts {expert_algo}", scheme)


def test_mixed_precision_without_quantized_experts_is_unquantized_moe():
    got = _mixed({"model.layers.0.self_attn.qkv_proj": ATTN})
    assert config.classify(got)[1] == "unquantized"


def test_experts_of_two_algos_are_an_adapter_mismatch_naming_them():
    got = _mixed({"model.layers.0.mlp.experts": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
                  "model.layers.1.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16}})
    with pytest.raises(AdapterMismatch, match=r"MIXED_PRECISION experts use \['NVFP4', 'W4A16_NVFP4'\]"):
        config.classify(got)
