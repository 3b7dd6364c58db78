"""MXFP4 (OCP Microscaling FP4): E2M1 weights in blocks of 32 consecutive inputs, one E8M0 scale (a power of two,
stored as its biased exponent byte) per block, and `encode`, which turns a gpt-oss family's fused expert weights
into one producer's export. Activations stay bf16 in the checkpoint (a backend may quantize them to MXFP8 itself).

The arithmetic is the OCP spec's, as vLLM's own quantizer (mxfp4_utils._compute_quant_and_scale) runs it: the
block's amax rounded to two mantissa bits, scale exponent floor(log2(that)) - 2 (E2M1's largest exponent),
clamped to [-127, 127]; values divided by the scale, rounded to the nearest E2M1 value with ties to even,
saturating at 6. Two codes a byte, the even input in the LOW nibble, bit 3 the sign. `dequantize` is the decode
written from the spec alone (a table and a power of two), independent of vLLM's helpers and of `quantize`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from quantmatrix.checkpoints import gpt_oss
from quantmatrix.checkpoints.base import Base
from quantmatrix.checkpoints.schemes import Encoded
from quantmatrix.schema.synthetic import SyntheticSpec

if TYPE_CHECKING:
    from quantmatrix.checkpoints.producers import Producer

NAME = "mxfp4"  # this module's key in a producer's LEAVES and RECIPES
BLOCK = 32  # inputs per E8M0 scale
E8M0_BIAS = 127
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitudes of codes 0..7; code | 8 is the negative
_MIDPOINTS = torch.tensor([(a + b) / 2 for a, b in zip(E2M1, E2M1[1:], strict=False)])


class Layout(Protocol):
    """One producer's MXFP4 names (its module's RECIPES["mxfp4"])."""

    def leaf(self, projection: str, role: str) -> str:
        """The leaf (under the experts module) of a fused projection's tensor of `role` (weight, block_scale)."""
        ...


def scale_exponents(w: torch.Tensor) -> torch.Tensor:
    """Unbiased E8M0 exponent of each block of 32 along the last dim (w [..., K], K a multiple of 32)."""
    amax = w.float().unflatten(-1, (-1, BLOCK)).abs().amax(-1)
    rounded = ((amax.view(torch.int32) + 0x200000) & 0x7F800000).view(torch.float32)  # amax to 2 mantissa bits
    exp = torch.floor(torch.log2(torch.where(rounded == 0, 2.0**-126, rounded))) - 2
    return exp.clamp(-E8M0_BIAS, E8M0_BIAS).to(torch.int32)


def _nearest_code(v: torch.Tensor) -> torch.Tensor:
    """E2M1 magnitude code of |v| (already divided by the scale): nearest value, ties to the even code."""
    mag = v.abs().clamp(max=E2M1[-1]).contiguous()
    code = torch.bucketize(mag, _MIDPOINTS, right=True)  # a tie goes up ...
    tie = (code > 0) & (mag == _MIDPOINTS[(code - 1).clamp(min=0)]) & (code % 2 == 1)
    return torch.where(tie, code - 1, code)  # ... unless that code is odd


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks uint8 [..., K/32, 16], scales uint8 [..., K/32]) of w [..., K]: the gpt-oss on-disk layout."""
    exp = scale_exponents(w)
    blocks = w.float().unflatten(-1, (-1, BLOCK)) / torch.exp2(exp.float()).unsqueeze(-1)
    codes = _nearest_code(blocks) | torch.where(blocks < 0, 8, 0)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return packed, (exp + E8M0_BIAS).to(torch.uint8)


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """w [..., K] from blocks [..., K/32, 16] and E8M0 scales [..., K/32]: E2M1 table x 2**(scale - 127)."""
    table = torch.tensor(E2M1 + tuple(-v for v in E2M1), dtype=torch.float32)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2).long()
    values = table[codes] * torch.exp2(scales.float() - E8M0_BIAS).unsqueeze(-1)
    return values.flatten(-2).to(dtype)


def encode(spec: SyntheticSpec, family: Base, producer: Producer) -> Encoded:
    """Each layer's fused expert weights (transformers' [E, in, out]) stored output-major ([E, out, in/32, ...],
    as gpt-oss's export and vLLM's w13/w2 hold them) in MXFP4, named by `producer`; biases, router and attention
    stay bf16. `dequantized` is what the stored blocks and scales decode to, in transformers' layout."""
    del spec  # MXFP4 has one variant: no flags change its tensors
    layout: Layout = producer.RECIPES[NAME]
    tensors = dict(family.tensors)
    dequantized = dict(family.tensors)
    for layer in range(family.config["num_hidden_layers"]):
        module = gpt_oss.experts_module(layer)
        for proj in gpt_oss.PROJECTIONS:
            w = tensors.pop(f"{module}.{proj}").transpose(-1, -2)
            blocks, scales = quantize(w)
            tensors[f"{module}.{layout.leaf(proj, 'weight')}"] = blocks
            tensors[f"{module}.{layout.leaf(proj, 'block_scale')}"] = scales
            dequantized[f"{module}.{proj}"] = dequantize(blocks, scales).transpose(-1, -2).contiguous()
    return Encoded(tensors, dequantized)
