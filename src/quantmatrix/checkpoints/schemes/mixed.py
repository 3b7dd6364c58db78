"""ModelOpt MIXED_PRECISION: one checkpoint whose projections carry different formats (NVFP4 experts, FP8
attention, bf16 projections), declared per module in the config's `quantized_layers`. The scheme composes the
existing ones: each projection is encoded by the scheme module of its algo (schemes.nvfp4, schemes.fp8), with that
module's names and recipe from the producer; what no plan glob matches stays bf16.

The plan is the factory scheme's `params` (schema.factory.SCHEMES): `plan` ((glob, algo), ...) over HF module
names, first match wins; `unmapped` and `unlisted` are globs the producer reads when it writes the map and the
ignore list (a malformed export's only difference is in its config).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import TYPE_CHECKING, Any

from quantmatrix.checkpoints.base import Base, dims, linear_shapes
from quantmatrix.checkpoints.schemes import Encoded, fp8, nvfp4
from quantmatrix.schema.synthetic import SyntheticSpec

if TYPE_CHECKING:
    from quantmatrix.checkpoints.producers import Producer

NAME = "mixed"
# a plan's algo -> the scheme module that encodes it and its quant_algo word in the map (ModelOpt's)
ALGOS = {"NVFP4": nvfp4.NAME, "FP8": fp8.NAME}


@dataclasses.dataclass(frozen=True)
class Plan:
    """The factory scheme's params: which projection gets which algo, and the config's deliberate gaps."""

    plan: tuple[tuple[str, str], ...]
    unmapped: tuple[str, ...] = ()
    unlisted: tuple[str, ...] = ()

    def algo(self, module: str) -> str | None:
        """The algo of an HF module name, None for bf16."""
        return next((algo for glob, algo in self.plan if fnmatch.fnmatchcase(module, glob)), None)

    def matches(self, module: str, globs: tuple[str, ...]) -> bool:
        return any(fnmatch.fnmatchcase(module, g) for g in globs)


def plan_of(spec: SyntheticSpec) -> Plan:
    return Plan(**dict(spec.factory.params))  # type: ignore[arg-type]


def layout(spec: SyntheticSpec, config: dict[str, Any]) -> dict[str, str | None]:
    """Every linear projection of the model (HF name) -> its algo, None for bf16."""
    plan = plan_of(spec)
    return {name: plan.algo(name) for name in linear_shapes(spec.model, dims(config))}


def encode(spec: SyntheticSpec, family: Base, producer: Producer) -> Encoded:
    """Each algo's projections encoded by its scheme module; the bf16 ones as they are."""
    algos = layout(spec, family.config)
    quantized = {m for m, a in algos.items() if a is not None}
    tensors = {k: v for k, v in family.tensors.items() if k.removesuffix(".weight") not in quantized}
    dequantized = dict(family.tensors)
    for algo, module in ALGOS.items():
        mine = [m for m, a in algos.items() if a == algo]
        if not mine:
            continue
        if module == nvfp4.NAME:
            part = nvfp4.encode(spec, family, producer, mine)
        else:
            part = fp8.encode_as(module, spec, family, producer, mine)
        tensors.update({k: v for k, v in part.tensors.items() if k.rpartition(".")[0] in mine})
        dequantized.update({f"{m}.weight": part.dequantized[f"{m}.weight"] for m in mine} if part.dequantized else {})
    return Encoded(tensors, dequantized)
