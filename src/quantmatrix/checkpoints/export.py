"""NVFP4 exports of a family's bf16 model, with each producer's tensor names and scale conventions, and the
malformed variants the spec asks for.

ModelOpt (unified HF export):   <m>.weight U8 [o, i/2], <m>.weight_scale F8_E4M3 [o, i/16],
                                <m>.weight_scale_2 F32 [] = amax/(6*448), <m>.input_scale F32 [] (W4A4)
compressed-tensors (nvfp4-pack-quantized): <m>.weight_packed U8, <m>.weight_scale F8_E4M3,
                                <m>.weight_global_scale F32 [1] = 6*448/amax, <m>.input_global_scale F32 [1]
Both fuse the global scale of modules that share an input (q/k/v, an expert's gate/up), as vLLM wants one
value per fused weight. Calibration differs: ModelOpt takes each expert's routed tokens, then syncs every
input amax to the max over the layer's experts; llm-compressor sends every token through every expert.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any

import torch

from quantmatrix.checkpoints import nvfp4
from quantmatrix.checkpoints.base import LAYOUTS, Base, dims, linear_shapes
from quantmatrix.errors import MatrixError
from quantmatrix.schema.synthetic import SyntheticSpec

_NAMES = {
    "modelopt": {"weight": "weight", "scale_2": "weight_scale_2", "input": "input_scale"},
    "compressed-tensors": {"weight": "weight_packed", "scale_2": "weight_global_scale",
                           "input": "input_global_scale"},
}


@dataclasses.dataclass(frozen=True)
class Export:
    tensors: dict[str, torch.Tensor]  # what the checkpoint holds, faults applied
    dequantized: dict[str, torch.Tensor]  # the bf16 model the clean export encodes


def quantized_modules(spec: SyntheticSpec, config: dict[str, Any]) -> list[str]:
    """Experts always, attention too for `quantize: experts_attention`; router and lm_head never."""
    return [name for name in linear_shapes(spec.model, dims(config))
            if ".experts." in name or (spec.quantize == "experts_attention" and ".self_attn." in name)]


def _fused_group(name: str, spec: SyntheticSpec) -> str:
    """Modules sharing an input share one global scale: q/k/v of a layer, gate/up of an expert."""
    lay = LAYOUTS[spec.model]
    parent, _, leaf = name.rpartition(".")
    if leaf in ("q_proj", "k_proj", "v_proj"):
        return f"{parent}.qkv"
    if leaf in (lay.gate, lay.up):
        return f"{parent}.gate_up"
    return name


def _input_amax(spec: SyntheticSpec, b: Base, modules: list[str]) -> dict[str, float]:
    if spec.producer == "compressed-tensors":
        return {m: b.input_amax[m]["all"] for m in modules}
    synced: dict[str, float] = {}  # ModelOpt: max over the layer's experts, per projection
    for m in modules:
        key = _expert_wildcard(m)
        synced[key] = max(synced.get(key, 0.0), b.input_amax[m]["routed"])
    return {m: synced[_expert_wildcard(m)] for m in modules}


def _expert_wildcard(name: str) -> str:
    head, sep, tail = name.partition(".experts.")
    return f"{head}.experts.*.{tail.partition('.')[2]}" if sep else name


def wants_input_scales(spec: SyntheticSpec) -> bool:
    """`auto` writes input scales exactly when the checkpoint really is W4A4 (its scheme, not its config)."""
    return {"auto": spec.scheme == "nvfp4_w4a4", "present": True, "absent": False}[spec.input_scales]


def export(spec: SyntheticSpec, b: Base) -> Export:
    """Quantize the family's bf16 model as `spec.producer` would, then apply the spec's faults."""
    names = _NAMES[spec.producer]
    modules = quantized_modules(spec, b.config)
    group_amax: dict[str, torch.Tensor] = {}
    for m in modules:
        amax = b.tensors[f"{m}.weight"].abs().max()
        key = _fused_group(m, spec)
        group_amax[key] = torch.maximum(group_amax.get(key, amax), amax)
    acts = _input_amax(spec, b, modules)
    group_act: dict[str, float] = {}
    for m in modules:
        key = _fused_group(m, spec)
        group_act[key] = max(group_act.get(key, 0.0), acts[m])

    tensors = {k: v for k, v in b.tensors.items() if k.removesuffix(".weight") not in modules}
    dequantized = dict(b.tensors)
    with_inputs = wants_input_scales(spec)
    for m in modules:
        w = b.tensors[f"{m}.weight"]
        amax = group_amax[_fused_group(m, spec)]
        act = torch.tensor(group_act[_fused_group(m, spec)], dtype=torch.bfloat16)
        if spec.producer == "modelopt":
            scale_2 = nvfp4.modelopt_scale_2(amax)
            q = nvfp4.quantize_modelopt(w, scale_2)
            stored_2, decode_2 = scale_2, scale_2
            input_scale = nvfp4.modelopt_scale_2(act)
        else:
            gs = nvfp4.ct_global_scale(amax)
            q = nvfp4.quantize_compressed_tensors(w, gs)
            stored_2, decode_2 = gs, 1.0 / gs  # vLLM inverts weight_global_scale before dequantizing
            input_scale = nvfp4.ct_global_scale(act)
        tensors[f"{m}.{names['weight']}"] = q.packed
        tensors[f"{m}.weight_scale"] = q.scale
        tensors[f"{m}.{names['scale_2']}"] = stored_2
        if with_inputs:
            tensors[f"{m}.{names['input']}"] = input_scale
        dequantized[f"{m}.weight"] = nvfp4.dequantize(q.packed, q.scale, decode_2, torch.bfloat16)
    _omit(spec, tensors)
    _corrupt(spec, tensors)
    return Export(dict(sorted(tensors.items())), dequantized)


def faulty(spec: SyntheticSpec, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of `tensors` with the spec's omissions and faults applied (used as is for bf16 checkpoints)."""
    out = dict(tensors)
    _omit(spec, out)
    _corrupt(spec, out)
    return out


def _matching(pattern: str, tensors: dict[str, torch.Tensor], flag: str) -> list[str]:
    hits = [k for k in tensors if fnmatch.fnmatchcase(k, pattern)]
    if not hits:
        sample = next((k for k in tensors if "experts" in k and "scale" in k), next(iter(tensors)))
        raise MatrixError(f"synthetic.{flag}: {pattern!r} matches no tensor of this checkpoint "
                          f"(names look like {sample!r})")
    return hits


def _omit(spec: SyntheticSpec, tensors: dict[str, torch.Tensor]) -> None:
    for pattern in spec.omit_tensors:
        for name in _matching(pattern, tensors, "omit_tensors"):
            del tensors[name]


def _corrupt(spec: SyntheticSpec, tensors: dict[str, torch.Tensor]) -> None:
    """zero / inf / nan overwrite every element; shape drops the last column (or doubles a scalar)."""
    for pattern, fault in spec.corrupt_tensors:
        for name in _matching(pattern, tensors, "corrupt_tensors"):
            t = tensors[name]
            if fault == "shape":
                tensors[name] = t.reshape(1).repeat(2) if t.numel() == 1 else t[..., :-1].contiguous()
                continue
            if not t.is_floating_point():
                raise MatrixError(f"synthetic.corrupt_tensors: {name} is {t.dtype}; a {fault} fault needs a "
                                  "floating tensor (a scale)")
            if fault == "inf" and t.dtype == torch.float8_e4m3fn:
                raise MatrixError(f"synthetic.corrupt_tensors: {name} is float8_e4m3fn, which has no inf "
                                  "(E4M3FN saturates or turns into NaN); use nan or zero")
            value = {"zero": 0.0, "inf": float("inf"), "nan": float("nan")}[fault]
            tensors[name] = torch.full_like(t.float(), value).to(t.dtype)
