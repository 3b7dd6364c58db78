"""Schemes of the synthetic factory: how a family's bf16 weights become one format's tensors.

A scheme module (`checkpoints.schemes.<module>`, named by schema.factory.SCHEMES) decides which projections it
quantizes and into which tensor roles, with the format's reference numerics; the producer it is given supplies
the names (its LEAVES[<module>]: role -> leaf) and the arithmetic (its RECIPES[<module>]). A new scheme is one
module with an `encode` plus a line in schema.factory.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING, Any, Protocol, cast

from quantmatrix.schema.synthetic import SyntheticSpec

if TYPE_CHECKING:
    import torch

    from quantmatrix.checkpoints.base import Base
    from quantmatrix.checkpoints.producers import Producer


@dataclasses.dataclass(frozen=True)
class Encoded:
    tensors: dict[str, torch.Tensor]  # what the checkpoint holds, in the producer's names, before any fault
    dequantized: dict[str, torch.Tensor] | None  # the bf16 model they encode; None: nothing was quantized


class Scheme(Protocol):
    def encode(self, spec: SyntheticSpec, family: Base, producer: Producer) -> Encoded:
        """The family's tensors in this scheme, as `producer` writes them."""
        ...


def scheme(spec: SyntheticSpec) -> Scheme:
    """The module that encodes the spec's factory scheme."""
    return cast(Scheme, importlib.import_module(f"{__name__}.{spec.factory.module}"))


def targets(spec: SyntheticSpec, config: dict[str, Any]) -> list[str]:
    """The modules a `quantize:` flag quantizes: experts always, attention too for `experts_attention`; router
    and lm_head never."""
    from quantmatrix.checkpoints.base import dims, linear_shapes

    return [name for name in linear_shapes(spec.model, dims(config))
            if ".experts." in name or (spec.quantize == "experts_attention" and ".self_attn." in name)]


def input_group(name: str, model: str) -> str:
    """Modules sharing an input share one activation (and NVFP4 global) scale: q/k/v of a layer, gate/up of an
    expert; vLLM keeps one per fused weight."""
    from quantmatrix.checkpoints.base import LAYOUTS

    lay = LAYOUTS[model]
    parent, _, leaf = name.rpartition(".")
    if leaf in ("q_proj", "k_proj", "v_proj"):
        return f"{parent}.qkv"
    if leaf in (lay.gate, lay.up):
        return f"{parent}.gate_up"
    return name
