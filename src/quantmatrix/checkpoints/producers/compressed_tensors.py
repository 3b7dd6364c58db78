"""compressed-tensors (llm-compressor's format) as a producer: its names, its NVFP4 recipe and calibration, and
its `quantization_config`, built by the compressed-tensors package itself.

NVFP4 (nvfp4-pack-quantized): <m>.weight_packed U8, <m>.weight_scale F8_E4M3, <m>.weight_global_scale F32 [1]
= 6*448/amax (the inverse of the dequant multiplier: vLLM inverts it), <m>.input_global_scale F32 [1].
FP8 (float-quantized; presets FP8, FP8_DYNAMIC, FP8_BLOCK): <m>.weight F8_E4M3 [o, i], <m>.weight_scale in the
model's dtype ([1] per tensor, [o, 1] per channel, [o/128, i/128] per block), <m>.input_scale [1] (FP8 only).
Calibration sends every token through every expert.

WNA16 (pack-quantized, the W4A16 / W8A16 presets): <m>.weight_packed I32 [out, in / (32/bits)] (symmetric codes
offset to unsigned and packed along the inputs by the package's own pack_to_int32), <m>.weight_scale BF16
[out, groups], <m>.weight_shape I64 [2], and <m>.weight_g_idx I32 [in] with actorder "group".
W8A8 INT8 (int-quantized, the W8A8 preset): <m>.weight I8 [out, in], <m>.weight_scale BF16 [out, 1]; activations
dynamic per token (no input scale).
W4A8 FP8 (the W4AFP8 preset): the WNA16 tensors (weight_packed, weight_scale [out, groups], weight_shape), format
pack-quantized: vLLM's W4A8 MoE method registers `weight_packed` int32 parameters, so only the packed export loads
(compressed-tensors 0.17's infer_module_format would call this preset int-quantized: unpacked int8 `weight`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from quantmatrix.checkpoints.configs import config_groups, excluded_modules
from quantmatrix.schema.synthetic import SyntheticSpec

if TYPE_CHECKING:
    import torch

    from quantmatrix.checkpoints.schemes import wna16
    from quantmatrix.checkpoints.schemes.nvfp4 import Quantized

# compressed-tensors replaces a zero block scale by the E4M3 "eps" it uses (calculate_qparams).
_ZERO_SCALE = 0.125
_FP8_LEAVES = {"weight": "weight", "block_scale": "weight_scale", "input_scale": "input_scale"}
LEAVES = {"nvfp4": {"weight": "weight_packed", "block_scale": "weight_scale", "global_scale": "weight_global_scale",
                    "input_scale": "input_global_scale"},
          "fp8": _FP8_LEAVES, "fp8_block": _FP8_LEAVES,
          "wna16": {"weight": "weight_packed", "block_scale": "weight_scale", "zero_point": "weight_zero_point",
                    "g_idx": "weight_g_idx", "weight_shape": "weight_shape"},
          "int8": {"weight": "weight", "block_scale": "weight_scale", "input_scale": "input_scale",
                   "zero_point": "weight_zero_point"},
          "w4a8": {"weight": "weight_packed", "block_scale": "weight_scale", "weight_shape": "weight_shape"}}
# WNA16 role -> (its dimensions in checkpoints.lint_wna16's words, when the package writes it)
SHAPES = {"wna16": {"weight": (("out", "in/pack"), "always"), "block_scale": (("out", "groups"), "always"),
                    "weight_shape": (("2",), "always"), "zero_point": (("out/pack", "groups"), "asymmetric"),
                    "g_idx": (("in",), "actorder")},
          "w4a8": {"weight": (("out", "in/pack"), "always"), "block_scale": (("out", "groups"), "always"),
                   "weight_shape": (("2",), "always")}}
# Per factory scheme: the package's preset with quantized activations, the weight-only one, and the format
# (WNA16's schemes are built from their bits and groups: _wna16_scheme).
_PRESETS = {"nvfp4_weight_only": ("NVFP4", "NVFP4A16", "nvfp4-pack-quantized"),
            "nvfp4_w4a4": ("NVFP4", "NVFP4A16", "nvfp4-pack-quantized"),
            "fp8_static": ("FP8", "FP8", "float-quantized"),
            "fp8_dynamic": ("FP8_DYNAMIC", "FP8_DYNAMIC", "float-quantized"),
            "fp8_block": ("FP8_BLOCK", "FP8_BLOCK", "float-quantized"),
            "w8a8_int8": ("W8A8", "W8A16", "int-quantized")}
# how its WNA16 codes sit in an int32 and what its stored zero points mean (measure.dequant decodes by it)
PACKING = {"wna16": {"slot_order": "sequential", "zero_offset": 0},
           "w4a8": {"slot_order": "sequential", "zero_offset": 0}}


def nvfp4_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' `generate_gparam`: 6 * 448 / amax computed in amax's own dtype (llm-compressor's
    observers hand it bf16 for bf16 models), non-finite -> 1.0, stored as float32 shape [1]."""
    import torch

    from quantmatrix.checkpoints.schemes.nvfp4 import E2M1_MAX, E4M3_MAX

    amax = torch.clamp(amax, min=torch.finfo(amax.dtype).tiny)
    gs = torch.nan_to_num(E4M3_MAX * E2M1_MAX / amax, nan=1.0, posinf=1.0, neginf=1.0)
    return gs.to(torch.float32).reshape([1])


def nvfp4_quantize(w: torch.Tensor, global_scale: torch.Tensor) -> Quantized:
    """compressed-tensors' calculate_qparams + quantize for NVFP4 (strategy tensor_group): block scale
    global_scale * (amax_b / 6) with amax_b in w's dtype, cast to E4M3, zeros -> 0.125; codes of
    w / (scale / global_scale), clamped to +-6."""
    import torch

    from quantmatrix.checkpoints.schemes import nvfp4

    b = nvfp4.blocks(w)
    amax_b = b.abs().amax(-1)
    scale = global_scale * (amax_b / nvfp4.E2M1_MAX)
    scale = scale.clamp(-nvfp4.E4M3_MAX, nvfp4.E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    scale = torch.where(scale == 0, torch.tensor(_ZERO_SCALE), scale)
    scaled = (b / (scale / global_scale).unsqueeze(-1)).clamp(-nvfp4.E2M1_MAX, nvfp4.E2M1_MAX)
    return nvfp4.finish(scaled, scale, w.shape)


class _NVFP4:
    """compressed-tensors' NVFP4 recipe (schemes.nvfp4.Recipe): it stores the quantizing global scale."""

    @staticmethod
    def input_amax(amax: Mapping[str, Mapping[str, float]], modules: Sequence[str]) -> dict[str, float]:
        """Every token through every expert (llm-compressor's calibration)."""
        return {m: amax[m]["all"] for m in modules}

    global_scale = staticmethod(nvfp4_global_scale)
    quantize = staticmethod(nvfp4_quantize)

    @staticmethod
    def decode_scale(stored: torch.Tensor) -> torch.Tensor:
        """vLLM inverts weight_global_scale before dequantizing."""
        return 1.0 / stored


class _FP8:
    """llm-compressor's FP8 calibration (schemes.fp8.Recipe): every token through every expert; scales stored in
    the model's dtype (what schemes.int8.Recipe asks of W8A8 INT8 too)."""

    scale_dtype = "bfloat16"
    input_amax = staticmethod(_NVFP4.input_amax)


class _WNA16:
    """compressed-tensors' pack-quantized layout (schemes.wna16.Export): symmetric, scales in the model's dtype."""

    symmetric = True

    @property
    def scale_dtype(self) -> torch.dtype:
        import torch

        return torch.bfloat16

    @staticmethod
    def tensors(q: wna16.Quantized, spec: SyntheticSpec) -> dict[str, torch.Tensor]:
        import torch
        from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

        signed = (q.codes - 2 ** (q.bits - 1)).to(torch.int8)
        out = {"weight": pack_to_int32(signed, q.bits, packed_dim=1),
               "block_scale": q.scale.to(torch.bfloat16).contiguous(),
               "weight_shape": torch.tensor(list(q.codes.shape), dtype=torch.int64)}
        from quantmatrix.checkpoints.schemes.wna16 import params

        if params(spec).actorder:
            out["g_idx"] = q.g_idx.to(torch.int32)
        return out


RECIPES = {"nvfp4": _NVFP4(), "fp8": _FP8(), "fp8_block": _FP8(), "wna16": _WNA16(), "int8": _FP8(),
           "w4a8": _WNA16()}


def _regex(glob: str) -> str:
    """A module glob as llm-compressor writes an ignore entry: `re:` and a regex (plain names stay plain)."""
    return glob if "*" not in glob else "re:" + glob.replace(".", r"\.").replace("*", ".*")


def _int_scheme(spec: SyntheticSpec) -> Any:
    """The package's W{bits}A16 preset (W4AFP8 for the w4a8 module) with the variant's group size (channel-wise
    for -1) and actorder."""
    from compressed_tensors.quantization import QuantizationArgs, preset_name_to_scheme

    from quantmatrix.checkpoints.schemes.wna16 import params

    p = params(spec)
    with_acts = spec.factory.module == "w4a8" and spec.activations == "quantized"
    scheme = preset_name_to_scheme("W4AFP8" if with_acts else f"W{p.bits}A16", ["Linear"])
    weights = scheme.weights.model_dump()
    if p.group_size == -1:
        weights.update(strategy="channel", group_size=None)
    else:
        weights.update(strategy="group", group_size=p.group_size, actorder="group" if p.actorder else None)
    scheme.weights = QuantizationArgs(**weights)
    return scheme


def quantization_config(spec: SyntheticSpec) -> dict[str, Any]:
    """`quantization_config` built by the compressed-tensors package itself from its preset for the scheme."""
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    if spec.factory.module in ("wna16", "w4a8"):
        scheme, fmt = _int_scheme(spec), "pack-quantized"
    else:
        with_acts, weight_only, fmt = _PRESETS[spec.scheme]
        scheme = preset_name_to_scheme(with_acts if spec.activations == "quantized" else weight_only, ["Linear"])
    qc = QuantizationConfig(config_groups={"group_0": scheme}, ignore=[_regex(g) for g in excluded_modules(spec)],
                            format=fmt, quantization_status="compressed")
    out = qc.model_dump(mode="json")
    group = out["config_groups"]["group_0"]
    if spec.activations == "missing":
        del group["input_activations"]
    elif spec.activations == "empty":
        group["input_activations"] = {}
    groups = config_groups(spec, group)
    if groups is None:
        del out["config_groups"]
    else:
        out["config_groups"] = groups
    return out


def config_files(spec: SyntheticSpec, plain: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`plain` with the quantization config in config.json (compressed-tensors has no other form)."""
    return {**plain, "config.json": {**plain["config.json"], "quantization_config": quantization_config(spec)}}
