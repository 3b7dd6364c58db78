"""The W4A8 FP8 scheme (compressed-tensors W4AFP8 preset): INT4 weights, symmetric, one scale per output row and
group of inputs, activations quantized dynamically per token to FP8 by the kernel (no activation scale in the files).

The weights are exactly an integer weight-only export (schemes.wna16's arithmetic, packed as the producer packs
`pack-quantized`); only the declared activations differ. vLLM 0.32's MoE method (CompressedTensorsW4A8Fp8MoEMethod)
asserts group size 128 and hidden / intermediate sizes that are multiples of 256, so a servable synthetic one is
block_tiny sized.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantmatrix.checkpoints.base import Base
from quantmatrix.checkpoints.schemes import Encoded
from quantmatrix.checkpoints.schemes.wna16 import encode_as
from quantmatrix.schema.synthetic import SyntheticSpec

if TYPE_CHECKING:
    from quantmatrix.checkpoints.producers import Producer

NAME = "w4a8"  # this module's key in a producer's LEAVES, RECIPES and SHAPES


def encode(spec: SyntheticSpec, family: Base, producer: Producer) -> Encoded:
    """The wna16 export of the spec's bits and group size, under the producer's W4A8 names."""
    return encode_as(NAME, spec, family, producer)
