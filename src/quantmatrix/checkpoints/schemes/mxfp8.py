"""MXFP8 (OCP Microscaling FP8): E4M3 weights in blocks of 32 consecutive inputs, one E8M0 scale (a power of two,
stored as its biased exponent byte) per block, and `encode`, which turns a family's per-expert Linears into one
producer's export. Activations stay bf16 in the checkpoint: vLLM's MXFP8 MoE (ModelOptMxFp8FusedMoE, 0.32) reads
weight and weight_scale only, quantizing activations itself where its backend wants them in MXFP8.

Conventions (vLLM 0.32 mxfp8_utils: MXFP8_VALUE_DTYPE float8_e4m3fn, MXFP8_SCALE_DTYPE uint8, MXFP8_BLOCK_SIZE 32):
  weight   float8_e4m3fn [o, i]                                                     role weight
  scale    U8 [o, i/32], value = float(q) * 2**(byte - 127)                          role block_scale
The arithmetic (which exponent a block gets) is the producer's RECIPES["mxfp8"]; `dequantize` is the decode written
from the spec alone (a power of two per block), independent of vLLM's helper and of any producer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from quantmatrix.checkpoints.base import Base
from quantmatrix.checkpoints.schemes import Encoded, targets
from quantmatrix.schema.synthetic import SyntheticSpec

if TYPE_CHECKING:
    from quantmatrix.checkpoints.producers import Producer

NAME = "mxfp8"  # this module's key in a producer's LEAVES and RECIPES
BLOCK = 32  # inputs per E8M0 scale
E8M0_BIAS = 127
E4M3_MAX = 448.0


class Recipe(Protocol):
    """One producer's MXFP8 quantizer (its module's RECIPES["mxfp8"])."""

    def quantize(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(float8_e4m3fn [..., K], uint8 E8M0 scales [..., K/32]) of w [..., K], K a multiple of 32."""
        ...


def dequantize(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """w [..., K] from E4M3 codes [..., K] and E8M0 scales [..., K/32]: float(q) x 2**(scale - 127) per block."""
    blocks = q.float().unflatten(-1, (-1, BLOCK)) * torch.exp2(scales.float() - E8M0_BIAS).unsqueeze(-1)
    return blocks.flatten(-2).to(dtype)


def encode(spec: SyntheticSpec, family: Base, producer: Producer) -> Encoded:
    """The spec's targets (experts, attention too for `experts_attention`) in MXFP8, named by `producer`; router,
    embeddings and lm_head stay bf16. `dequantized` is what the stored codes and scales decode to."""
    names, recipe = producer.LEAVES[NAME], producer.RECIPES[NAME]
    modules = targets(spec, family.config)
    tensors = {k: v for k, v in family.tensors.items() if k.removesuffix(".weight") not in modules}
    dequantized = dict(family.tensors)
    for m in modules:
        q, scales = recipe.quantize(family.tensors[f"{m}.weight"])
        tensors[f"{m}.{names['weight']}"] = q
        tensors[f"{m}.{names['block_scale']}"] = scales
        dequantized[f"{m}.weight"] = dequantize(q, scales)
    return Encoded(tensors, dequantized)
