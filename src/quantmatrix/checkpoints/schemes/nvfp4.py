"""The NVFP4 scheme: its tensor roles, shapes and dtypes, the reference numerics in plain torch (the e2m1 grid,
nibble packing, E4M3 block scales, dequantization, vLLM's own activation quantizer), and `encode`, which turns a
family's bf16 weights into one producer's NVFP4 export.

Every party's block-scale arithmetic differs in the last bit: ModelOpt divides by `weight_scale_2`,
compressed-tensors divides by `scale / global_scale` computed from bf16 observers, and vLLM's own reference (used
to emulate activation quantization) multiplies by reciprocals. On bf16 weights those orders of operation disagree
on about 1 code in 1,500 (exact ties such as 1.75 land one ulp apart), so a factory that wants to write what a
producer writes has to use that producer's recipe: each producer module (checkpoints.producers) holds its own
(`RECIPES["nvfp4"]`, a `Recipe`), on the shared core here. tests/test_nvfp4.py pins each recipe bit for bit
against the code it imitates.

Conventions (linear layout, what checkpoints store; vLLM swizzles after loading):
  codes    4 bits each: bit 3 sign (set iff x < 0), bits 0-2 index into E2M1_GRID; two per uint8, LOW nibble
           first (element 2j in bits 0-3, element 2j+1 in bits 4-7).            role weight, U8 [o, i/2]
  scale    float8_e4m3fn, one per BLOCK consecutive inputs, shape [..., rows, cols / BLOCK].   role block_scale
  scale_2  the per-tensor DEQUANT multiplier (role global_scale, F32, one element): ModelOpt stores it
           (`weight_scale_2` = amax / (6 * 448)); compressed-tensors stores its inverse (`weight_global_scale`).
  input    the activations' per-tensor scale (role input_scale, F32, one element), in the producer's own sense.
  value    = e2m1 * (float(scale) * scale_2)
Modules sharing an input share one global scale (q/k/v of a layer, gate/up of an expert): vLLM keeps one value
per fused weight, and both producers write it so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch

from quantmatrix.checkpoints.base import Base
from quantmatrix.checkpoints.schemes import Encoded, input_group, targets
from quantmatrix.schema.synthetic import SyntheticSpec

if TYPE_CHECKING:
    from quantmatrix.checkpoints.producers import Producer

NAME = "nvfp4"  # this module's key in a producer's LEAVES and RECIPES
BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between grid values; a value exactly on a midpoint goes to the grid value with an even
# mantissa (round half to even), i.e. up at 0.75, 1.75 and 3.5 and down at 0.25, 1.25, 2.5 and 5.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_ROUND_UP_TIES = (0.75, 1.75, 3.5)


class Quantized(NamedTuple):
    packed: torch.Tensor  # uint8 [..., rows, cols / 2]
    scale: torch.Tensor  # float8_e4m3fn [..., rows, cols / BLOCK]


class Recipe(Protocol):
    """One producer's NVFP4 arithmetic and calibration (its module's RECIPES["nvfp4"])."""

    def input_amax(self, amax: Mapping[str, Mapping[str, float]], modules: Sequence[str]) -> dict[str, float]:
        """Each module's calibrated input amax, from the family's {"routed": ..., "all": ...} statistics."""
        ...

    def global_scale(self, amax: torch.Tensor) -> torch.Tensor:
        """The per-tensor scale the producer stores for an amax (weights and activations alike)."""
        ...

    def decode_scale(self, stored: torch.Tensor) -> torch.Tensor:
        """The dequant multiplier (scale_2) vLLM derives from the stored global scale."""
        ...

    def quantize(self, w: torch.Tensor, stored: torch.Tensor) -> Quantized:
        """Codes and block scales of w under the stored global scale."""
        ...


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """4-bit codes of x (already divided by its scale) rounded to nearest-even on the e2m1 grid; |x| > 6
    saturates to 6. Negative values that round to zero keep their sign bit (-0), as every producer does."""
    mag = x.abs().float()
    bounds = torch.tensor(_MIDPOINTS, device=x.device)
    code = torch.searchsorted(bounds, mag.contiguous(), out_int32=True)
    ties = torch.zeros_like(mag, dtype=torch.bool)
    for t in _ROUND_UP_TIES:
        ties |= mag == t
    code = code + ties.to(torch.int32)
    return (code + (x < 0).to(torch.int32) * 8).to(torch.uint8)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of 4-bit codes; code 8 is -0.0 (vLLM's break_fp4_bytes decodes it so)."""
    grid = torch.tensor(E2M1_GRID, device=codes.device)
    mag = grid[(codes & 0x07).long()]
    return mag * torch.where((codes & 0x08).bool(), -1.0, 1.0)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """Two codes per byte along the last dim, low nibble first."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack needs an even last dimension, got shape {tuple(codes.shape)}")
    return (codes[..., 1::2] << 4) | codes[..., 0::2]


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack: [..., n] uint8 -> [..., 2n] codes."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)


def blocks(x: torch.Tensor) -> torch.Tensor:
    """x as [..., cols / BLOCK, BLOCK]: one row per block scale."""
    if x.shape[-1] % BLOCK:
        raise ValueError(f"NVFP4 needs the input dimension to be a multiple of {BLOCK}, got {tuple(x.shape)}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)


def finish(codes_blocks: torch.Tensor, scale: torch.Tensor, shape: torch.Size) -> Quantized:
    """Round the scaled blocks onto the grid, pack them back into `shape` and cast the block scales to E4M3."""
    return Quantized(pack(e2m1_codes(codes_blocks).reshape(shape)), scale.to(torch.float8_e4m3fn))


def _reciprocal(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (x + (x == 0) * 1e8)


def quantize_vllm(x: torch.Tensor, global_scale: torch.Tensor) -> Quantized:
    """vLLM's ref_nvfp4_quant (how its emulation quantizes activations): block scale
    global_scale * (amax_b * (1/6)) clamped to +-448, no floor (tiny blocks get scale 0); codes of
    x * 1 / (scale * 1 / global_scale), clamped to +-6."""
    b = blocks(x)
    amax_b = b.abs().amax(-1).to(torch.float32)
    scale = global_scale * (amax_b * (1 / E2M1_MAX))
    scale = scale.clamp(min=-E4M3_MAX, max=E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    out_scale = _reciprocal(scale * _reciprocal(global_scale))
    scaled = (b.to(torch.float32) * out_scale.unsqueeze(-1)).clamp(-E2M1_MAX, E2M1_MAX)
    return finish(scaled, scale, x.shape)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor,
               dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """vLLM's dequantize_to_dtype(swizzle=False) arithmetic: e2m1 * (float(scale) * scale_2), then cast.
    scale_2 must broadcast against `scale` (0-d or [1] for one tensor, [E, 1, 1] for stacked experts)."""
    values = blocks(e2m1_values(unpack(packed)))
    factors = scale.view(torch.float8_e4m3fn).to(torch.float32) * scale_2
    out = values * factors.unsqueeze(-1)
    return out.reshape(*out.shape[:-2], -1).to(dtype)


# ---------------------------------------------------------------------------------------------- the export


def encode(spec: SyntheticSpec, family: Base, producer: Producer, modules: list[str] | None = None) -> Encoded:
    """The family's bf16 model quantized as `producer` does: its recipe's arithmetic and calibration, its names
    (LEAVES["nvfp4"]: role -> leaf); input scales where the spec wants them; dequantized/ decoded the way vLLM
    decodes the stored tensors. `modules`: the ones to quantize (default: the spec's targets)."""
    names, recipe = producer.LEAVES[NAME], producer.RECIPES[NAME]
    modules = targets(spec, family.config) if modules is None else modules
    group_amax: dict[str, torch.Tensor] = {}
    for m in modules:
        amax = family.tensors[f"{m}.weight"].abs().max()
        key = input_group(m, spec.model)
        group_amax[key] = torch.maximum(group_amax.get(key, amax), amax)
    acts = recipe.input_amax(family.input_amax, modules)
    group_act: dict[str, float] = {}
    for m in modules:
        key = input_group(m, spec.model)
        group_act[key] = max(group_act.get(key, 0.0), acts[m])

    tensors = {k: v for k, v in family.tensors.items() if k.removesuffix(".weight") not in modules}
    dequantized = dict(family.tensors)
    for m in modules:
        key = input_group(m, spec.model)
        stored = recipe.global_scale(group_amax[key])
        q = recipe.quantize(family.tensors[f"{m}.weight"], stored)
        tensors[f"{m}.{names['weight']}"] = q.packed
        tensors[f"{m}.{names['block_scale']}"] = q.scale
        tensors[f"{m}.{names['global_scale']}"] = stored
        if spec.with_input_scales:
            act = torch.tensor(group_act[key], dtype=torch.bfloat16)
            tensors[f"{m}.{names['input_scale']}"] = recipe.global_scale(act)
        dequantized[f"{m}.weight"] = dequantize(q.packed, q.scale, recipe.decode_scale(stored), torch.bfloat16)
    return Encoded(tensors, dequantized)
