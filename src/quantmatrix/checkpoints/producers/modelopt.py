"""ModelOpt (NVIDIA TensorRT Model Optimizer) as a producer: its unified HF export's names, its NVFP4 recipe and
calibration, and its config files (config.json `quantization_config`, or the legacy hf_quant_config.json).

NVFP4 (unified HF export): <m>.weight U8 [o, i/2], <m>.weight_scale F8_E4M3 [o, i/16],
<m>.weight_scale_2 F32 [] = amax/(6*448), <m>.input_scale F32 [] (W4A4). Calibration takes each expert's routed
tokens, then syncs every input amax to the max over the layer's experts.
FP8 (quant_algo FP8): <m>.weight F8_E4M3 [o, i], <m>.weight_scale F32 [] = amax/448, <m>.input_scale F32 [].
MXFP8 (quant_algo MXFP8): <m>.weight F8_E4M3 [o, i], <m>.weight_scale U8 [o, i/32] (E8M0: each block of 32 inputs
scaled by 2**ceil(log2(amax_b / 448)), the exponent biased by 127 and clamped to [0, 254]); no input_scale.
MIXED_PRECISION: each projection in one of the above, declared per module in `quantized_layers` ({module:
{"quant_algo": ..., "group_size": 16 for NVFP4}}, HF names); the bf16 ones listed in `ignore` (`exclude_modules`
in hf_quant_config.json).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from quantmatrix.checkpoints.configs import config_groups, excluded_modules
from quantmatrix.schema.synthetic import SyntheticSpec

if TYPE_CHECKING:
    import torch

    from quantmatrix.checkpoints.schemes.nvfp4 import Quantized

VERSION = "0.37.0"  # the ModelOpt release the configs claim
# ModelOpt floors block scales at the smallest E4M3 subnormal so no block scale is ever 0.
E4M3_MIN_SUBNORMAL = 2.0**-9
LEAVES = {"nvfp4": {"weight": "weight", "block_scale": "weight_scale", "global_scale": "weight_scale_2",
                    "input_scale": "input_scale"},
          "fp8": {"weight": "weight", "block_scale": "weight_scale", "input_scale": "input_scale"},
          "mxfp8": {"weight": "weight", "block_scale": "weight_scale"}}
# Per scheme module: quant_algo, and the weights' (and quantized activations') config-group arguments.
# (ModelOpt's FP8 is per-tensor weights with static per-tensor activations: quant_algo FP8.)
_ALGO = {"nvfp4_weight_only": "NVFP4", "nvfp4_w4a4": "NVFP4", "fp8_static": "FP8", "mxfp8": "MXFP8"}
MIXED, MIXED_ALGO = "mixed", "MIXED_PRECISION"  # the scheme module of per-module formats, and its quant_algo
_ARGS = {"nvfp4": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16},
         "fp8": {"dynamic": False, "num_bits": 8, "type": "float"},
         "mxfp8": {"dynamic": False, "num_bits": 8, "type": "float", "group_size": 32}}


def nvfp4_scale_2(amax: torch.Tensor) -> torch.Tensor:
    """ModelOpt's `weight_scale_2` / `input_scale`: amax / (6 * 448) in float32, a 0-d tensor."""
    from quantmatrix.checkpoints.schemes.nvfp4 import E2M1_MAX, E4M3_MAX

    return (amax.float() / (E2M1_MAX * E4M3_MAX)).reshape(())


def nvfp4_quantize(w: torch.Tensor, weight_scale_2: torch.Tensor) -> Quantized:
    """ModelOpt's NVFP4QTensor.quantize: block scale amax_b / (6 * scale_2), all-zero blocks -> 1.0, clamped
    to [2**-9, 448]; codes of w / (float(scale) * scale_2)."""
    import torch

    from quantmatrix.checkpoints.schemes import nvfp4

    b = nvfp4.blocks(w)
    amax_b = b.abs().amax(-1).float()
    scale = amax_b / (nvfp4.E2M1_MAX * weight_scale_2)
    scale[scale == 0] = 1.0
    scale = scale.clamp(min=E4M3_MIN_SUBNORMAL, max=nvfp4.E4M3_MAX).to(torch.float8_e4m3fn)
    scaled = b / (scale.to(torch.float32) * weight_scale_2).unsqueeze(-1)
    return nvfp4.finish(scaled, scale, w.shape)


def _expert_wildcard(name: str) -> str:
    head, sep, tail = name.partition(".experts.")
    return f"{head}.experts.*.{tail.partition('.')[2]}" if sep else name


class _NVFP4:
    """ModelOpt's NVFP4 recipe (schemes.nvfp4.Recipe): it stores the dequant multiplier itself."""

    @staticmethod
    def input_amax(amax: Mapping[str, Mapping[str, float]], modules: Sequence[str]) -> dict[str, float]:
        """Routed tokens per expert, then the max over the layer's experts, per projection."""
        synced: dict[str, float] = {}
        for m in modules:
            key = _expert_wildcard(m)
            synced[key] = max(synced.get(key, 0.0), amax[m]["routed"])
        return {m: synced[_expert_wildcard(m)] for m in modules}

    global_scale = staticmethod(nvfp4_scale_2)
    quantize = staticmethod(nvfp4_quantize)

    @staticmethod
    def decode_scale(stored: torch.Tensor) -> torch.Tensor:
        return stored


class _FP8:
    """ModelOpt's FP8 calibration (schemes.fp8.Recipe): routed tokens, max over the layer's experts; F32 scales."""

    scale_dtype = "float32"
    input_amax = staticmethod(_NVFP4.input_amax)


class _MXFP8:
    """ModelOpt's MXFP8QTensor (schemes.mxfp8.Recipe): per block of 32 inputs the smallest power of two that
    brings the block's amax within E4M3's 448, as vLLM's own reference quantizer (_mxfp8_e4m3_quantize_torch)."""

    @staticmethod
    def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        from quantmatrix.checkpoints.schemes.mxfp8 import BLOCK, E4M3_MAX, E8M0_BIAS

        blocks = w.float().unflatten(-1, (-1, BLOCK))
        amax = blocks.abs().amax(-1).clamp(min=torch.finfo(torch.float32).tiny)
        biased = (torch.ceil(torch.log2(amax / E4M3_MAX)) + E8M0_BIAS).clamp(0, 2 * E8M0_BIAS)
        q = (blocks / torch.exp2(biased - E8M0_BIAS).unsqueeze(-1)).flatten(-2).to(torch.float8_e4m3fn)
        return q, biased.to(torch.uint8)


RECIPES: dict[str, Any] = {"nvfp4": _NVFP4(), "fp8": _FP8(), "mxfp8": _MXFP8()}
# MIXED_PRECISION (schemes.mixed): each module named and computed as its own algo's scheme module does
LEAVES[MIXED] = {**LEAVES["fp8"], **LEAVES["nvfp4"]}
RECIPES[MIXED] = dict(RECIPES)


def _algo(spec: SyntheticSpec) -> str:
    if spec.quant_algo:
        return spec.quant_algo
    if spec.scheme not in _ALGO:
        raise ValueError(f"ModelOpt exports no {spec.scheme} checkpoint here (it writes {', '.join(_ALGO)}; its "
                         "quant_algo FP8 is per-tensor weights with static activation scales)")
    return _ALGO[spec.scheme]


def _group(spec: SyntheticSpec, args: dict[str, Any]) -> dict[str, Any]:
    group: dict[str, Any] = {"weights": dict(args), "targets": ["Linear"]}
    acts = spec.activations
    if acts == "quantized":
        group["input_activations"] = dict(args)
    elif acts == "null":
        group["input_activations"] = None
    elif acts == "empty":
        group["input_activations"] = {}
    return group


def _mixed(spec: SyntheticSpec) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """MIXED_PRECISION's per-module map and ignore list, from the scheme's plan (schemes.mixed): every quantized
    projection but the `unmapped` ones in the map, lm_head and every bf16 projection but the `unlisted` ones
    ignored."""
    from quantmatrix.checkpoints.configs import model_config
    from quantmatrix.checkpoints.schemes import mixed

    plan = mixed.plan_of(spec)
    algos = mixed.layout(spec, model_config(spec.model, spec.size))
    layers = {m: {"quant_algo": a, **({"group_size": _ARGS["nvfp4"]["group_size"]} if a == "NVFP4" else {})}
              for m, a in algos.items() if a is not None and not plan.matches(m, plan.unmapped)}
    ignore = ["lm_head", *(m for m, a in algos.items() if a is None and not plan.matches(m, plan.unlisted))]
    return layers, list(dict.fromkeys(ignore))


def quantization_config(spec: SyntheticSpec) -> dict[str, Any]:
    """config.json `quantization_config` as ModelOpt's unified HF exporter writes it."""
    module = spec.factory.module
    if module == MIXED:
        layers, ignore = _mixed(spec)
        return {"quant_method": "modelopt", "quant_algo": MIXED_ALGO, "kv_cache_quant_algo": None,
                "producer": {"name": "modelopt", "version": VERSION}, "quantized_layers": layers, "ignore": ignore}
    qc: dict[str, Any] = {
        "quant_method": "modelopt",
        "quant_algo": _algo(spec),
        "producer": {"name": "modelopt", "version": VERSION},
        "ignore": excluded_modules(spec),
    }
    groups = config_groups(spec, _group(spec, _ARGS[module]))
    if groups is not None:
        qc["config_groups"] = groups
    return qc


def hf_quant_config(spec: SyntheticSpec) -> dict[str, Any]:
    """Legacy hf_quant_config.json: no config_groups, so it cannot say "weight-only" except by quant_algo."""
    module = spec.factory.module
    if module == MIXED:
        layers, ignore = _mixed(spec)
        return {"producer": {"name": "modelopt", "version": VERSION},
                "quantization": {"quant_algo": MIXED_ALGO, "kv_cache_quant_algo": None,
                                 "group_size": _ARGS["nvfp4"]["group_size"], "exclude_modules": ignore,
                                 "quantized_layers": layers}}
    return {
        "producer": {"name": "modelopt", "version": VERSION},
        "quantization": {
            "quant_algo": _algo(spec),
            "kv_cache_quant_algo": None,
            "group_size": _ARGS[module].get("group_size"),
            "exclude_modules": excluded_modules(spec),
        },
    }


def config_files(spec: SyntheticSpec, plain: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`plain` with the quantization config in config.json, or beside it in hf_quant_config.json (form legacy)."""
    if spec.form == "legacy":
        return {**plain, "hf_quant_config.json": hf_quant_config(spec)}
    return {**plain, "config.json": {**plain["config.json"], "quantization_config": quantization_config(spec)}}
