"""vLLM's own MXFP4 decoding pieces, for dequant_logits: its E2M1 unpacking (0.32:
`nvfp4_emulation_utils.break_fp4_bytes`, the nibble order and table its emulation runs; MXFP4's E2M1 is NVFP4's)
and its E8M0 block descale (`mxfp8_utils.dequant_mxfp8_to_bf16`: 2**(scale - 127) per 32 values). vLLM's
`mxfp4_utils._dequant_mxfp4` would do both at once but needs amd-quark; these two import without it. The
factory's own decoder (checkpoints.schemes.mxfp4.dequantize) is checked against this one in tests/test_mxfp4.py.
MXFP8 (ModelOpt quant_algo MXFP8) is that descale alone on E4M3 values: `dequantize_mxfp8`, the decode vLLM's
ModelOptMxFp8FusedMoE itself runs on its emulation path (tests/test_mxfp8.py checks the factory's against it)."""

from __future__ import annotations

import importlib
from typing import Any

from quantmatrix.adapter.versions import versions
from quantmatrix.errors import AdapterMismatch

_UTILS = "vllm.model_executor.layers.quantization.utils"
_HELPERS = ((f"{_UTILS}.nvfp4_emulation_utils", "break_fp4_bytes"), (f"{_UTILS}.mxfp8_utils", "dequant_mxfp8_to_bf16"))


def _helpers() -> tuple[Any, Any]:
    try:
        found = [getattr(importlib.import_module(module), name) for module, name in _HELPERS]
    except (ImportError, AttributeError) as e:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: {e}; update quantmatrix/adapter/mxfp4.py") from e
    return found[0], found[1]


def dequantize_mxfp4(blocks: Any, scales: Any) -> Any:
    """bf16 [..., K] from gpt-oss's blocks U8 [..., K/32, 16] and E8M0 scales U8 [..., K/32]."""
    import torch

    unpack, descale = _helpers()
    lead, k = blocks.shape[:-2], blocks.shape[-2] * blocks.shape[-1] * 2
    values = unpack(blocks.reshape(-1, k // 2).contiguous(), torch.float32)
    return descale(values, scales.reshape(-1, k // 32)).reshape(*lead, k)


def dequantize_mxfp8(values: Any, scales: Any) -> Any:
    """bf16 [..., K] from E4M3 values [..., K] and E8M0 scales U8 [..., K/32] (vLLM's dequant_mxfp8_to_bf16)."""
    return _helpers()[1](values, scales)
