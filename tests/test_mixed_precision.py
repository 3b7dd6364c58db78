"""ModelOpt MIXED_PRECISION (nvidia/Qwen3.6-35B-A3B-NVFP4's format): vLLM's own config class, built from a
quantization config as the checkpoint carries it, is classified by the algo of its MoE experts - W4A16_NVFP4
experts are the seed bug's weight-only shape, whatever FP8 the attention uses."""

from __future__ import annotations

import os

import pytest
from ci_rule import run_copy

from quantmatrix.adapter import config
from quantmatrix.errors import AdapterMismatch

try:
    from vllm.model_executor.layers.quantization import get_quantization_config
except ImportError as e:  # CI errors instead of skipping (.ci/run sets CI=1): a skip would hide lost coverage
    if os.environ.get("CI"):
        raise ImportError(f"vLLM's quantization configs are not importable ({e}): under CI the MIXED_PRECISION "
                          "classification must run") from e
    pytest.skip(f"vLLM's quantization configs are not importable here ({e})", allow_module_level=True)


def _mixed(layers: dict[str, dict[str, object]]) -> object:
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


@pytest.mark.parametrize("ci", ["1", ""], ids=["under-CI", "local"])
def test_without_vllm_this_file_errors_under_ci_and_skips_only_locally(pytester, monkeypatch, ci):
    """With vLLM's quantization package blocked, this very file errors at collection under CI=1 and skips, saying
    why, elsewhere (the project's rule, as tests/test_nvfp4.py follows it)."""
    import sys

    monkeypatch.setitem(sys.modules, "vllm.model_executor.layers.quantization", None)
    run_copy(pytester, monkeypatch, open(__file__).read(), ci, "errors_under_ci",
             "vLLM's quantization configs are not importable", "vLLM's quantization configs are not importable here")


@pytest.mark.parametrize(("checkpoint", "o_proj_1"), [("qwen3moe-tiny-mo-mixed", "fp8_static"),
                                                      ("qwen3moe-tiny-mo-mixed-unmapped-proj", "unquantized")])
def test_vllm_builds_every_projection_as_the_map_declares_it(checkpoint, o_proj_1):
    """vLLM 0.32's per-projection methods for the factory's MIXED_PRECISION exports: FP8 q/k/v (fused qkv_proj)
    and o_proj in layer 0, layer 1's q/k/v, the routers and lm_head bf16; layer 1's o_proj FP8 where the map lists
    it, silently bf16 where it does not (the lint names its dropped tensors)."""
    from pathlib import Path

    from quantmatrix.checkpoints import store
    from quantmatrix.schema.load import load

    matrix = load(Path(__file__).resolve().parent.parent / "matrices" / "default.yaml")
    got = config.resolve(store.materialize(next(c for c in matrix.checkpoints if c.id == checkpoint)))
    assert got.scheme == "w4a4" and got.method == "modelopt_mixed"
    assert {p.prefix: p.built for p in got.projections} == {
        "model.layers.0.self_attn.qkv_proj": "fp8_static", "model.layers.0.self_attn.o_proj": "fp8_static",
        "model.layers.0.mlp.gate": "unquantized", "model.layers.1.self_attn.qkv_proj": "unquantized",
        "model.layers.1.self_attn.o_proj": o_proj_1, "model.layers.1.mlp.gate": "unquantized",
        "lm_head": "unquantized"}
    assert all(p.declared == p.built for p in got.projections)
