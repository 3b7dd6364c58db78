"""vLLM's own FP8 dequantization (0.32: `quantization/utils/quant_utils.py` `scaled_dequantize`, the inverse of the
`scaled_quantize` its block-FP8 paths use): the dequant_logits check decodes an FP8 export with it, so the scale
broadcast (per tensor, per channel, 128x128 blocks) is vLLM's, never the factory's."""

from __future__ import annotations

import importlib
from typing import Any

from quantmatrix.adapter.versions import versions
from quantmatrix.errors import AdapterMismatch

FP8_QUANT_UTILS = "vllm.model_executor.layers.quantization.utils.quant_utils"


def _fp8_helper(name: str) -> Any:
    try:
        return getattr(importlib.import_module(FP8_QUANT_UTILS), name)
    except (ImportError, AttributeError) as e:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: no {FP8_QUANT_UTILS}.{name} ({e}); update "
                              "quantmatrix/adapter/fp8.py") from e


def dequantize_fp8(weight: Any, scale: Any, block: tuple[int, int] | None, dtype: Any) -> Any:
    """`weight` (F8_E4M3, [out, in]) times its scale: one value, one per output row ([out] or [out, 1]), or one
    per `block` of the weight (`weight_scale_inv`, [out / block0, in / block1])."""
    if block is None:
        scale = scale.float().reshape(-1, 1) if scale.numel() > 1 else scale.float().reshape(())
        return _fp8_helper("scaled_dequantize")(weight, scale, None, dtype)
    # vLLM's block kernels cover a ragged edge with a partial block (the grid is ceil(out/128) x ceil(in/128));
    # scaled_dequantize takes whole blocks only, so pad to them and crop back
    rows, cols = weight.shape
    pad = (-cols % block[1], -rows % block[0])
    import torch

    padded = torch.nn.functional.pad(weight.float(), (0, pad[0], 0, pad[1])).to(weight.dtype)
    group = _fp8_helper("GroupShape")(*block)
    return _fp8_helper("scaled_dequantize")(padded, scale.float(), group, dtype)[:rows, :cols]
