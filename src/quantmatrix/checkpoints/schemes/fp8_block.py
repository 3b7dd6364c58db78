"""Block-wise FP8: 128x128 weight blocks, each with its own dequant multiplier (DeepSeek's `weight_scale_inv`,
compressed-tensors' FP8_BLOCK `weight_scale`), activations quantized dynamically per 128-group. Its own scheme
module because producers name its scale differently from per-tensor FP8; the numerics are checkpoints.schemes.fp8's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantmatrix.checkpoints.base import Base
from quantmatrix.checkpoints.schemes import Encoded, fp8
from quantmatrix.schema.synthetic import SyntheticSpec

if TYPE_CHECKING:
    from quantmatrix.checkpoints.producers import Producer

NAME = "fp8_block"


def encode(spec: SyntheticSpec, family: Base, producer: Producer) -> Encoded:
    """Block scales (schema.factory's fp8_block scheme has granularity `block`)."""
    return fp8.encode_as(NAME, spec, family, producer)
