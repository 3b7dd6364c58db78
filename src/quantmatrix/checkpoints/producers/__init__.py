"""Producers of the synthetic factory: how a producer names, packs and declares quantized tensors, and the one
producer tensor-name table (role_of, the lint, dequant_logits read it).

A producer module (`checkpoints.producers.<module>`, named by schema.factory.PRODUCERS) holds, per scheme module
it writes, its tensor names (LEAVES: role -> leaf) and its arithmetic (RECIPES, the scheme's Recipe protocol),
and writes its config files. A new producer is one module plus a line in schema.factory. This package imports
nothing heavy: the vLLM plugins (engine.poison, the guard) read role_of in every engine process.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from quantmatrix.adapter.roles import leaf
from quantmatrix.schema.factory import PRODUCERS, SCHEMES

if TYPE_CHECKING:
    from quantmatrix.schema.synthetic import SyntheticSpec


class Producer(Protocol):
    LEAVES: Mapping[str, Mapping[str, str]]  # scheme module -> tensor role (schema.vocab.ROLES) -> leaf name
    RECIPES: Mapping[str, Any]  # scheme module -> its arithmetic for that scheme (the scheme's Recipe)

    def config_files(self, spec: SyntheticSpec, plain: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The checkpoint's config files: `plain` (config.json, generation_config.json of the unquantized
        model) with this producer's declaration of the spec's quantization."""
        ...


def producer(name: str) -> Producer:
    """The module of a matrix producer (a key of schema.factory.PRODUCERS)."""
    return cast(Producer, importlib.import_module(f"{__name__}.{PRODUCERS[name].module}"))


def leaves(name: str, scheme: str) -> Mapping[str, str]:
    """Role -> leaf name of producer `name`'s tensors in scheme module `scheme`."""
    return producer(name).LEAVES[scheme]


def shapes(name: str, scheme: str) -> Mapping[str, tuple[tuple[str, ...], str]]:
    """Role -> (dimension words, when it is written) of producer `name`'s tensors in scheme module `scheme`, for
    the schemes whose producers lay them out differently (checkpoints.lint_wna16); empty where none is stated."""
    return getattr(producer(name), "SHAPES", {}).get(scheme, {})


def packing(name: str, scheme: str) -> Mapping[str, Any]:
    """How producer `name` packs scheme module `scheme`'s codes (its PACKING: int32 slot order, zero offset); empty
    where it states none."""
    return getattr(producer(name), "PACKING", {}).get(scheme, {})


def writers(scheme: str) -> dict[str, Mapping[str, str]]:
    """Every producer that names tensors of scheme module `scheme`, with its role -> leaf names."""
    return {name: producer(name).LEAVES[scheme] for name in PRODUCERS if scheme in producer(name).LEAVES}


@functools.cache
def quantized_leaves(scheme: str) -> frozenset[str]:
    """Every leaf any producer names in scheme module `scheme` that no unquantized tensor carries (a bf16
    `weight` is not evidence of quantization)."""
    plain = {lf for s in SCHEMES.values() if not s.quantized for names in writers(s.module).values()
             for lf in names.values()}
    return frozenset(lf for names in writers(scheme).values() for lf in names.values()) - plain


@functools.cache
def _roles() -> dict[str, str]:
    """Leaf -> role over every producer and scheme; one leaf in two roles is a bug of a producer module."""
    out: dict[str, str] = {}
    for name in PRODUCERS:
        for scheme, names in producer(name).LEAVES.items():
            for role, lf in names.items():
                if out.setdefault(lf, role) != role:
                    raise ValueError(f"producer {name!r} names its {scheme} {role} {lf!r}, which another producer "
                                     f"uses for {out[lf]}: role_of could not tell them apart")
    return out


def role_of(param_name: str) -> str:
    """The tensor role (schema.vocab.ROLES) of a checkpoint tensor or vLLM parameter name, "other" when no producer
    names it (biases, router weights)."""
    return _roles().get(leaf(param_name), "other")
