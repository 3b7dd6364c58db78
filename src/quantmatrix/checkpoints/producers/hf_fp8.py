"""The `fp8` quant_method as a producer: transformers' FineGrainedFP8 and DeepSeek's exports, read by vLLM's
Fp8Config (`activation_scheme`, `weight_block_size`, `ignored_layers` / `modules_to_not_convert`).

Per tensor: <m>.weight F8_E4M3 [o, i], <m>.weight_scale F32 [] (the dequant multiplier), <m>.input_scale F32 []
with `activation_scheme: static`. Block-wise: <m>.weight_scale_inv F32 [ceil(o/128), ceil(i/128)] (despite its
name, also the dequant multiplier), `weight_block_size: [128, 128]`, `activation_scheme: dynamic`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from quantmatrix.checkpoints.configs import excluded_modules
from quantmatrix.schema.synthetic import SyntheticSpec

LEAVES = {"fp8": {"weight": "weight", "block_scale": "weight_scale", "input_scale": "input_scale"},
          "fp8_block": {"weight": "weight", "block_scale": "weight_scale_inv", "input_scale": "input_scale"}}


class _FP8:
    """Calibration with every token through every expert; F32 scales."""

    scale_dtype = "float32"

    @staticmethod
    def input_amax(amax: Mapping[str, Mapping[str, float]], modules: Sequence[str]) -> dict[str, float]:
        return {m: amax[m]["all"] for m in modules}


RECIPES = {"fp8": _FP8(), "fp8_block": _FP8()}


def ignored_layers(spec: SyntheticSpec, config: dict[str, Any]) -> list[str]:
    """The modules left in bf16, each by its full name: vLLM's Fp8Config matches `ignored_layers` exactly (no
    globs), and skips a fused q/k/v only when every shard is named."""
    from quantmatrix.checkpoints.base import dims, linear_shapes

    globs = excluded_modules(spec)
    return [name for name in linear_shapes(spec.model, dims(config))
            if any(fnmatch.fnmatchcase(name, g) for g in globs)]


def quantization_config(spec: SyntheticSpec, config: dict[str, Any]) -> dict[str, Any]:
    """config.json `quantization_config`: static activations exactly when the scheme calibrates input scales."""
    if spec.factory.granularity == "channel":
        raise ValueError(f"the fp8 quant_method has per-tensor or 128x128 block weight scales, not the per-channel "
                         f"ones of {spec.scheme}")
    qc: dict[str, Any] = {"quant_method": "fp8",
                          "activation_scheme": "static" if spec.factory.input_scales else "dynamic",
                          "ignored_layers": ignored_layers(spec, config)}
    if spec.factory.granularity == "block":
        qc["weight_block_size"] = [128, 128]
    return qc


def config_files(spec: SyntheticSpec, plain: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`plain` with the quantization config in config.json (the only place vLLM's Fp8Config is read from)."""
    cfg = plain["config.json"]
    return {**plain, "config.json": {**cfg, "quantization_config": quantization_config(spec, cfg)}}
