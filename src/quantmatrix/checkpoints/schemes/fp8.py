"""The FP8 (E4M3) scheme: weights cast to float8_e4m3fn under a dequant multiplier per tensor, per output channel
or per 128x128 block (DeepSeek-style `weight_scale_inv`), and activations either with a calibrated static
per-tensor `input_scale` (the kernel reads it: the seed bug's twin) or quantized dynamically per token / per
128-group (the kernel must read none).

Conventions (what checkpoints store; every producer stores the DEQUANT multiplier, whatever the leaf is called):
  weight   float8_e4m3fn [o, i], value = float(q) * scale                          role weight
  scale    F32 (ModelOpt, HF fp8) or the model dtype (compressed-tensors): [] / [1] per tensor, [o, 1] per
           channel, [ceil(o/128), ceil(i/128)] per block                              role block_scale
  input    F32 one element, amax / 448 of the projection's calibrated inputs         role input_scale
Modules sharing an input (gate/up of an expert, q/k/v) share one input scale; vLLM keeps one per fused weight.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from quantmatrix.checkpoints.base import Base
from quantmatrix.checkpoints.schemes import Encoded, input_group, targets
from quantmatrix.schema.synthetic import SyntheticSpec

if TYPE_CHECKING:
    from quantmatrix.checkpoints.producers import Producer

NAME = "fp8"  # this module's key in a producer's LEAVES and RECIPES (checkpoints.schemes.fp8_block: "fp8_block")
E4M3_MAX = 448.0
BLOCK = 128  # the weight block of the block-wise format (vLLM's weight_block_size [128, 128])


class Recipe(Protocol):
    """One producer's FP8 calibration and storage (its module's RECIPES["fp8"] / ["fp8_block"])."""

    scale_dtype: str  # the torch dtype the weight scales are stored as ("float32", "bfloat16")

    def input_amax(self, amax: Mapping[str, Mapping[str, float]], modules: Sequence[str]) -> dict[str, float]:
        """Each module's calibrated input amax, from the family's {"routed": ..., "all": ...} statistics."""
        ...


def _safe(amax: torch.Tensor) -> torch.Tensor:
    return torch.where(amax > 0, amax, torch.ones_like(amax)) / E4M3_MAX


def weight_scale(w: torch.Tensor, granularity: str) -> torch.Tensor:
    """The dequant multiplier of w (float32): amax / 448 over the whole tensor, each output row, or each
    128x128 block (edge blocks cover what is left)."""
    a = w.abs().float()
    if granularity == "tensor":
        return _safe(a.amax()).reshape(())
    if granularity == "channel":
        return _safe(a.amax(dim=1, keepdim=True))
    o, i = a.shape
    pad = torch.nn.functional.pad(a, (0, -i % BLOCK, 0, -o % BLOCK))
    blocks = pad.reshape(pad.shape[0] // BLOCK, BLOCK, pad.shape[1] // BLOCK, BLOCK)
    return _safe(blocks.amax(dim=(1, 3)))


def expand(scale: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A scale broadcast over a weight of `shape`: one element or [o, 1] as it is, a block grid repeated over its
    128x128 blocks."""
    if scale.numel() == 1 or tuple(scale.shape) == (shape[0], 1):
        return scale.reshape(()) if scale.numel() == 1 else scale
    full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return full[: shape[0], : shape[1]]


def quantize(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w / scale, saturated to +-448, cast to float8_e4m3fn (round to nearest even)."""
    return (w.float() / expand(scale.float(), w.shape)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """float(q) * scale, cast to dtype."""
    return (q.float() * expand(scale.float(), q.shape)).to(dtype)


def encode_as(module: str, spec: SyntheticSpec, family: Base, producer: Producer,
              modules: list[str] | None = None) -> Encoded:
    """The family's bf16 model in FP8 as `producer` names it under scheme module `module` (fp8 or fp8_block):
    weight scales of the spec's granularity, input scales where the spec wants them. `modules`: the ones to
    quantize (default: the spec's targets)."""
    names, recipe = producer.LEAVES[module], producer.RECIPES[module]
    granularity = spec.factory.granularity
    modules = targets(spec, family.config) if modules is None else modules
    acts = recipe.input_amax(family.input_amax, modules)
    group_act: dict[str, float] = {}
    for m in modules:
        key = input_group(m, spec.model)
        group_act[key] = max(group_act.get(key, 0.0), acts[m])
    tensors: dict[str, Any] = {k: v for k, v in family.tensors.items() if k.removesuffix(".weight") not in modules}
    dequantized = dict(family.tensors)
    for m in modules:
        w = family.tensors[f"{m}.weight"]
        scale = weight_scale(w, granularity).to(getattr(torch, recipe.scale_dtype))
        q = quantize(w, scale)
        tensors[f"{m}.{names['weight']}"] = q
        tensors[f"{m}.{names['block_scale']}"] = scale
        if spec.with_input_scales:
            amax = torch.tensor(group_act[input_group(m, spec.model)], dtype=torch.float32)
            tensors[f"{m}.{names['input_scale']}"] = _safe(amax).reshape(())
        dequantized[f"{m}.weight"] = dequantize(q, scale)
    return Encoded(tensors, dequantized)


def encode(spec: SyntheticSpec, family: Base, producer: Producer) -> Encoded:
    """Per-tensor or per-channel FP8 (schema.factory's `granularity`)."""
    return encode_as(NAME, spec, family, producer)
