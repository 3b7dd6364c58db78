"""The W8A8 INT8 scheme (compressed-tensors `int-quantized`, the W8A8 preset): int8 weights with one dequant
multiplier per output channel, activations quantized dynamically per token by the kernel (no activation scale in
the files: vLLM's INT8 MoE refuses static ones).

Conventions (compressed-tensors' calculate_qparams, symmetric int8):
  weight   int8 [o, i], value = q * scale, q = round(w / scale) clamped to [-128, 127]     role weight
  scale    [o, 1] in the producer's scale dtype, amax of the row / 127.5 (a zero row: 1.0)  role block_scale
The codes are computed from the stored (rounded) scale, so `dequantized` is exactly what the files decode to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

from quantmatrix.checkpoints.base import Base
from quantmatrix.checkpoints.schemes import Encoded, targets
from quantmatrix.errors import MatrixError
from quantmatrix.schema.synthetic import SyntheticSpec

if TYPE_CHECKING:
    from quantmatrix.checkpoints.producers import Producer

NAME = "int8"  # this module's key in a producer's LEAVES and RECIPES
HALF_RANGE = 127.5  # (bit_max - bit_min) / 2 for int8: compressed-tensors' symmetric scale divisor


class Recipe(Protocol):
    """One producer's W8A8 INT8 storage (its module's RECIPES["int8"])."""

    scale_dtype: str  # the torch dtype the weight scales are stored as ("bfloat16", "float32")


def weight_scale(w: torch.Tensor) -> torch.Tensor:
    """One dequant multiplier per output row, [o, 1] float32: amax / 127.5, 1.0 for an all-zero row."""
    amax = w.abs().float().amax(dim=1, keepdim=True)
    return torch.where(amax > 0, amax / HALF_RANGE, torch.ones_like(amax))


def quantize(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """round(w / scale) (to nearest even), clamped to the int8 range."""
    return torch.round(w.float() / scale.float()).clamp(-128, 127).to(torch.int8)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return (q.float() * scale.float()).to(dtype)


def encode(spec: SyntheticSpec, family: Base, producer: Producer) -> Encoded:
    """The family's bf16 model in W8A8 INT8 as `producer` names it (LEAVES["int8"]), scales stored in its
    recipe's dtype."""
    if spec.with_input_scales:
        raise MatrixError(f"{spec.scheme}: W8A8 INT8 quantizes activations dynamically per token; the factory writes "
                          "no input-scale tensors for it (input_scales: present)")
    names, recipe = producer.LEAVES[NAME], producer.RECIPES[NAME]
    modules = targets(spec, family.config)
    tensors: dict[str, Any] = {k: v for k, v in family.tensors.items() if k.removesuffix(".weight") not in modules}
    dequantized = dict(family.tensors)
    for m in modules:
        w = family.tensors[f"{m}.weight"]
        scale = weight_scale(w).to(getattr(torch, recipe.scale_dtype))
        q = quantize(w, scale)
        tensors[f"{m}.{names['weight']}"] = q
        tensors[f"{m}.{names['block_scale']}"] = scale
        dequantized[f"{m}.weight"] = dequantize(q, scale)
    return Encoded(tensors, dequantized)
