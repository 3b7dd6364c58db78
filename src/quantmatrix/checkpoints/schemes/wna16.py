"""The integer weight-only scheme (WNA16: INT4 / INT8 weights, bf16 activations): group-wise or channel-wise
scales, symmetric or with zero points, optional activation order (g_idx), and `encode`, which turns a family's
bf16 weights into one producer's export.

The arithmetic here is the format's, producer-neutral: codes are unsigned `bits`-bit integers, value =
(code - zero) * scale, with one scale (and zero) per output row and group of inputs. Symmetric quantization uses
the fixed zero 2**(bits-1) (vLLM's uint4b8 / uint8b128) and scale amax / ((2**bits - 1) / 2), as GPTQ and
compressed-tensors compute it; with zero points (AWQ), scale (max - min) / (2**bits - 1) and zero
round(-min / scale). Activation order (GPTQ desc_act, compressed-tensors actorder "group") forms the groups over
the inputs sorted by a calibration statistic; g_idx[i] is the group of input i, so each group holds exactly
`group_size` inputs and g_idx is a permutation of the plain grid's group indices.

How the codes, scales and zeros are laid out (int32 packing order, transposes, names) is each producer's: its
RECIPES["wna16"] (an `Export`) packs a `Quantized` into its tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch

from quantmatrix.checkpoints.base import Base
from quantmatrix.checkpoints.schemes import Encoded, targets
from quantmatrix.schema.synthetic import SyntheticSpec

if TYPE_CHECKING:
    from quantmatrix.checkpoints.producers import Producer

NAME = "wna16"  # this module's key in a producer's LEAVES and RECIPES


class Params(NamedTuple):
    """One WNA16 variant, from the factory scheme's `params` (schema.factory.SCHEMES)."""

    bits: int
    group_size: int  # -1: one group per row (channel-wise)
    actorder: bool = False


class Quantized(NamedTuple):
    """One weight [out, in] quantized, in plain (unpacked, untransposed) form."""

    codes: torch.Tensor  # int32 [out, in], unsigned `bits`-bit codes
    scale: torch.Tensor  # float32 [out, groups]
    zero: torch.Tensor  # int32 [out, groups], unsigned codes (2**(bits-1) when symmetric)
    g_idx: torch.Tensor  # int32 [in]: the group of each input
    bits: int
    group_size: int  # the effective size (the input dim for channel-wise)
    symmetric: bool


class Export(Protocol):
    """One producer's WNA16 layout (its module's RECIPES["wna16"])."""

    symmetric: bool  # whether the producer writes symmetric codes (no zero points of its own)
    scale_dtype: torch.dtype  # the dtype its scales are stored in

    def tensors(self, q: Quantized, spec: SyntheticSpec) -> dict[str, torch.Tensor]:
        """role -> the tensor the producer stores for it (packed, transposed, cast as it writes them)."""
        ...


def params(spec: SyntheticSpec) -> Params:
    return Params(**dict(spec.factory.params))


def group_index(cols: int, group_size: int, order: torch.Tensor | None) -> torch.Tensor:
    """g_idx: the group of each input; with an activation order, groups are consecutive runs of `order`."""
    position = torch.arange(cols, dtype=torch.int32)
    if order is not None:
        position = torch.empty_like(position).scatter_(0, order, position)
    return position // group_size


def quantize(w: torch.Tensor, bits: int, group_size: int, symmetric: bool,
             order: torch.Tensor | None = None) -> Quantized:
    """Codes, scales and zeros of w [out, in] (see the module docstring); `order` is the activation order (the
    inputs in the order their groups are formed), None for the plain grid. group_size -1: channel-wise. A group
    size that does not divide the inputs leaves a last, shorter group (GPTQ and compressed-tensors do so)."""
    rows, cols = w.shape
    size = cols if group_size == -1 else group_size
    g_idx = group_index(cols, size, order)
    groups = int(g_idx.max()) + 1
    x = w.float()
    maxq = 2**bits - 1
    scale = torch.empty(rows, groups)
    zero = torch.empty(rows, groups, dtype=torch.int32)
    for g in range(groups):
        cols_g = x[:, g_idx == g]
        lo, hi = cols_g.amin(1).clamp(max=0), cols_g.amax(1).clamp(min=0)
        if symmetric:
            amax = torch.maximum(lo.abs(), hi)
            scale[:, g] = torch.where(amax > 0, amax / (maxq / 2), torch.ones_like(amax))
            zero[:, g] = 2 ** (bits - 1)
        else:
            span = hi - lo
            scale[:, g] = torch.where(span > 0, span / maxq, torch.ones_like(span))
            zero[:, g] = torch.round(-lo / scale[:, g]).clamp(0, maxq).to(torch.int32)
    s, z = scale[:, g_idx.long()], zero[:, g_idx.long()]
    codes = (torch.round(x / s) + z).clamp(0, maxq).to(torch.int32)
    return Quantized(codes, scale, zero, g_idx, bits, size, symmetric)


def dequantize(q: Quantized, scale_dtype: torch.dtype, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """(code - zero) * scale, each input with its group's scale and zero; scales rounded to `scale_dtype` first
    (what the checkpoint stores)."""
    idx = q.g_idx.long()
    scale = q.scale.to(scale_dtype).float()
    return ((q.codes - q.zero[:, idx]).float() * scale[:, idx]).to(dtype)


def pack_int32(values: torch.Tensor, bits: int, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Unsigned `bits`-bit codes packed 32 // bits to an int32 along `dim`: slot k (bits k*bits..) of each int32
    holds element order[k] of its run of consecutive elements (None: element k)."""
    per = 32 // bits
    v = values.movedim(dim, -1).to(torch.int64)
    if v.shape[-1] % per:
        raise ValueError(f"cannot pack {v.shape[-1]} values {per} to an int32")
    runs = v.reshape(*v.shape[:-1], -1, per)
    if order is not None:
        runs = runs[..., list(order)]
    shifts = torch.arange(per, dtype=torch.int64) * bits
    packed = (runs << shifts).sum(-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.movedim(-1, dim).contiguous()


def activation_order(w: torch.Tensor) -> torch.Tensor:
    """The inputs in descending order of their weight column's squared norm (the per-input statistic a
    synthetic model without per-channel calibration has; GPTQ orders by the Hessian's diagonal), ties by index."""
    norms = w.float().pow(2).sum(0)
    return torch.sort(-norms, stable=True).indices.to(torch.int32)


def encode_as(module: str, spec: SyntheticSpec, family: Base, producer: Producer) -> Encoded:
    """The family's bf16 model with integer weights as `producer` writes them under scheme module `module` (wna16,
    or w4a8, whose weights are the same packed export): its names (LEAVES[module]: role -> leaf), its layout
    (RECIPES[module]); `dequantized` is what the stored codes, scales and zeros decode to."""
    names: Mapping[str, str] = producer.LEAVES[module]
    export: Export = producer.RECIPES[module]
    p = params(spec)
    modules = targets(spec, family.config)
    tensors = {k: v for k, v in family.tensors.items() if k.removesuffix(".weight") not in modules}
    dequantized = dict(family.tensors)
    for m in modules:
        w = family.tensors[f"{m}.weight"]
        order = activation_order(w) if p.actorder else None
        q = quantize(w, p.bits, p.group_size, export.symmetric, order)
        for role, t in export.tensors(q, spec).items():
            tensors[f"{m}.{names[role]}"] = t
        dequantized[f"{m}.weight"] = dequantize(q, export.scale_dtype, torch.bfloat16)
    return Encoded(tensors, dequantized)


def encode(spec: SyntheticSpec, family: Base, producer: Producer) -> Encoded:
    """Integer weight-only (WNA16)."""
    return encode_as(NAME, spec, family, producer)
