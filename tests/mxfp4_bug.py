"""A hand-made vLLM MXFP4 bug, for proving that the cpu tier catches it: E8M0 scales read transposed.

Loaded as a pytest plugin (`-p mxfp4_bug`) into a child pytest only: it changes vLLM's E8M0 block descale
(`mxfp8_utils.dequant_mxfp8_to_bf16`, which the cpu tier's MXFP4 decoding calls through adapter/mxfp4.py) to take
its [rows, blocks] scale grid in [blocks, rows] order, the way a kernel-format conversion that forgot a transpose
would, so every block is scaled by another block's exponent while every shape still fits.
"""

from __future__ import annotations

from typing import Any


def pytest_configure(config: Any) -> None:
    from vllm.model_executor.layers.quantization.utils import mxfp8_utils

    original = mxfp8_utils.dequant_mxfp8_to_bf16

    def transposed(x: Any, scales: Any) -> Any:
        return original(x, scales.t().contiguous().reshape(scales.shape))

    mxfp8_utils.dequant_mxfp8_to_bf16 = transposed
