"""The unquantized scheme: the family's bf16 weights as they are (a bf16 checkpoint is its own reference)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantmatrix.checkpoints.base import Base
from quantmatrix.checkpoints.schemes import Encoded
from quantmatrix.schema.synthetic import SyntheticSpec

if TYPE_CHECKING:
    from quantmatrix.checkpoints.producers import Producer


def encode(spec: SyntheticSpec, family: Base, producer: Producer) -> Encoded:
    """Every tensor in bf16, named as transformers names it; nothing to decode."""
    return Encoded(dict(family.tensors), None)
