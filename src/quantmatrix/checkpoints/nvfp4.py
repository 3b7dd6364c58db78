"""Reference NVFP4 numerics in plain torch: the e2m1 grid, nibble packing, E4M3 block scales, global scales.

One shared core (rounding onto the e2m1 grid, packing, dequantization) and one block-scale recipe per
party, because the parties really do differ in the last bit: ModelOpt divides by `weight_scale_2`,
compressed-tensors divides by `scale / global_scale` computed from bf16 observers, and vLLM's own
reference (used to emulate activation quantization) multiplies by reciprocals. On bf16 weights those
orders of operation disagree on about 1 code in 1,500 (exact ties such as 1.75 land one ulp apart), so a
factory that wants to write what a producer writes has to use that producer's recipe. tests/test_nvfp4.py
pins each recipe bit for bit against the code it imitates.

Conventions (linear layout, what checkpoints store; vLLM swizzles after loading):
  codes    4 bits each: bit 3 sign (set iff x < 0), bits 0-2 index into E2M1_GRID; two per uint8, LOW nibble
           first (element 2j in bits 0-3, element 2j+1 in bits 4-7).
  scale    float8_e4m3fn, one per BLOCK consecutive inputs, shape [..., rows, cols / BLOCK].
  scale_2  the per-tensor DEQUANT multiplier: ModelOpt's `weight_scale_2` = amax / (6 * 448);
           compressed-tensors stores the inverse (`weight_global_scale` = 6 * 448 / amax).
  value    = e2m1 * (float(scale) * scale_2)
"""

from __future__ import annotations

from typing import NamedTuple

import torch

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between grid values; a value exactly on a midpoint goes to the grid value with an even
# mantissa (round half to even), i.e. up at 0.75, 1.75 and 3.5 and down at 0.25, 1.25, 2.5 and 5.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_ROUND_UP_TIES = (0.75, 1.75, 3.5)
# ModelOpt floors block scales at the smallest E4M3 subnormal so no block scale is ever 0.
E4M3_MIN_SUBNORMAL = 2.0**-9
# compressed-tensors replaces a zero block scale by the E4M3 "eps" it uses (calculate_qparams).
_CT_ZERO_SCALE = 0.125


class Quantized(NamedTuple):
    packed: torch.Tensor  # uint8 [..., rows, cols / 2]
    scale: torch.Tensor  # float8_e4m3fn [..., rows, cols / BLOCK]


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


def _blocks(x: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % BLOCK:
        raise ValueError(f"NVFP4 needs the input dimension to be a multiple of {BLOCK}, got {tuple(x.shape)}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)


def _finish(codes_blocks: torch.Tensor, scale: torch.Tensor, shape: torch.Size) -> Quantized:
    return Quantized(pack(e2m1_codes(codes_blocks).reshape(shape)), scale.to(torch.float8_e4m3fn))


# ----------------------------------------------------------------------------------------- global scales


def modelopt_scale_2(amax: torch.Tensor) -> torch.Tensor:
    """ModelOpt's `weight_scale_2` / `input_scale`: amax / (6 * 448) in float32, a 0-d tensor."""
    return (amax.float() / (E2M1_MAX * E4M3_MAX)).reshape(())


def ct_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' `generate_gparam`: 6 * 448 / amax computed in amax's own dtype (llm-compressor's
    observers hand it bf16 for bf16 models), non-finite -> 1.0, stored as float32 shape [1]."""
    amax = torch.clamp(amax, min=torch.finfo(amax.dtype).tiny)
    gs = torch.nan_to_num(E4M3_MAX * E2M1_MAX / amax, nan=1.0, posinf=1.0, neginf=1.0)
    return gs.to(torch.float32).reshape([1])


# --------------------------------------------------------------------------------------------- recipes


def quantize_modelopt(w: torch.Tensor, weight_scale_2: torch.Tensor) -> Quantized:
    """ModelOpt's NVFP4QTensor.quantize: block scale amax_b / (6 * scale_2), all-zero blocks -> 1.0, clamped
    to [2**-9, 448]; codes of w / (float(scale) * scale_2)."""
    blocks = _blocks(w)
    amax_b = blocks.abs().amax(-1).float()
    scale = amax_b / (E2M1_MAX * weight_scale_2)
    scale[scale == 0] = 1.0
    scale = scale.clamp(min=E4M3_MIN_SUBNORMAL, max=E4M3_MAX).to(torch.float8_e4m3fn)
    scaled = blocks / (scale.to(torch.float32) * weight_scale_2).unsqueeze(-1)
    return _finish(scaled, scale, w.shape)


def quantize_compressed_tensors(w: torch.Tensor, global_scale: torch.Tensor) -> Quantized:
    """compressed-tensors' calculate_qparams + quantize for NVFP4 (strategy tensor_group): block scale
    global_scale * (amax_b / 6) with amax_b in w's dtype, cast to E4M3, zeros -> 0.125; codes of
    w / (scale / global_scale), clamped to +-6."""
    blocks = _blocks(w)
    amax_b = blocks.abs().amax(-1)
    scale = global_scale * (amax_b / E2M1_MAX)
    scale = scale.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    scale = torch.where(scale == 0, torch.tensor(_CT_ZERO_SCALE), scale)
    scaled = (blocks / (scale / global_scale).unsqueeze(-1)).clamp(-E2M1_MAX, E2M1_MAX)
    return _finish(scaled, scale, w.shape)


def _reciprocal(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (x + (x == 0) * 1e8)


def quantize_vllm(x: torch.Tensor, global_scale: torch.Tensor) -> Quantized:
    """vLLM's ref_nvfp4_quant (how its emulation quantizes activations): block scale
    global_scale * (amax_b * (1/6)) clamped to +-448, no floor (tiny blocks get scale 0); codes of
    x * 1 / (scale * 1 / global_scale), clamped to +-6."""
    blocks = _blocks(x)
    amax_b = blocks.abs().amax(-1).to(torch.float32)
    scale = global_scale * (amax_b * (1 / E2M1_MAX))
    scale = scale.clamp(min=-E4M3_MAX, max=E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    out_scale = _reciprocal(scale * _reciprocal(global_scale))
    scaled = (blocks.to(torch.float32) * out_scale.unsqueeze(-1)).clamp(-E2M1_MAX, E2M1_MAX)
    return _finish(scaled, scale, x.shape)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor,
               dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """vLLM's dequantize_to_dtype(swizzle=False) arithmetic: e2m1 * (float(scale) * scale_2), then cast.
    scale_2 must broadcast against `scale` (0-d or [1] for one tensor, [E, 1, 1] for stacked experts)."""
    values = _blocks(e2m1_values(unpack(packed)))
    factors = scale.view(torch.float8_e4m3fn).to(torch.float32) * scale_2
    out = values * factors.unsqueeze(-1)
    return out.reshape(*out.shape[:-2], -1).to(dtype)
