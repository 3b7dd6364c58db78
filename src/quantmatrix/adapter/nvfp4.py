"""vLLM's own NVFP4 decoding (0.32: `nvfp4_emulation_utils.dequantize_to_dtype`, the arithmetic its emulation
backend runs). The dequant_logits check decodes a checkpoint's packed weights with it, not with the factory's
`checkpoints.schemes.nvfp4.unpack`, so a nibble-order or layout bug that the factory makes the same way when packing
and when unpacking still shows."""

from __future__ import annotations

import importlib
from typing import Any

from quantmatrix.adapter.versions import versions
from quantmatrix.errors import AdapterMismatch

EMULATION_UTILS = "vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils"


def dequantize(packed: Any, block_scale: Any, global_scale: Any, dtype: Any) -> Any:
    """e2m1 * (float(block_scale) * global_scale), cast to dtype, as vLLM decodes linear (unswizzled) scales.
    `global_scale` is the dequant multiplier (ModelOpt's weight_scale_2; 1 / compressed-tensors'
    weight_global_scale)."""
    try:
        fn = importlib.import_module(EMULATION_UTILS).dequantize_to_dtype
    except (ImportError, AttributeError) as e:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: no {EMULATION_UTILS}.dequantize_to_dtype "
                              f"({e}); update quantmatrix/adapter/nvfp4.py") from e
    return fn(packed, block_scale, global_scale, dtype, swizzle=False)
