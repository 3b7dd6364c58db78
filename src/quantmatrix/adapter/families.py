"""How each family of vLLM's MoE quant methods says what it built: the activation scheme it runs (in the
matrix's `resolves_to` words, schema.vocab.RESOLUTIONS) and the name of the read-set (package data backends.yaml)
that describes the kernel backend it selected.

One row per vLLM MoE method class. A new scheme family (FP8, WNA16, ...) is a reader function and its rows here;
the layer builder (adapter.layers) and every check read `MoELayer.scheme` / `.backend` and never a vLLM attribute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from quantmatrix.errors import AdapterMismatch


@dataclasses.dataclass(frozen=True)
class Reading:
    """What one built MoE method runs, in quantmatrix's words."""

    scheme: str  # a schema.vocab.RESOLUTIONS word: weight_only, w4a4, unquantized, ...
    backend: str  # the read-set's name in backends.yaml ("none": no kernel backend to describe)
    weight_only: bool  # activations run unquantized (the method's own view)


def _enum_name(value: Any) -> str:
    """A backend enum's value, "none" when the method keeps none."""
    return getattr(value, "value", str(value)) if value is not None else "none"


def _nvfp4(method: Any, use_a16: Callable[[Any], bool]) -> Reading:
    """NVFP4: `use_a16` (where each release keeps it: adapter.layers) and the `nvfp4_backend` enum, named as is."""
    weight_only = use_a16(method)
    backend = _enum_name(getattr(method, "nvfp4_backend", None))
    return Reading("weight_only" if weight_only else "w4a4", backend, weight_only)


def _unquantized(method: Any, use_a16: Callable[[Any], bool]) -> Reading:
    return Reading("unquantized", "none", False)


def _fp8(scheme: str, method: Any) -> Reading:
    """FP8: the `fp8_backend` enum, its read-set named per activation scheme (a static kernel reads input_scale,
    the same backend run dynamically reads none): FP8_<backend> or FP8_DYNAMIC_<backend>."""
    kind = "FP8_" if scheme == "fp8_static" else "FP8_DYNAMIC_"
    return Reading(scheme, kind + _enum_name(getattr(method, "fp8_backend", None)), False)


def _fp8_modelopt(method: Any, use_a16: Callable[[Any], bool]) -> Reading:
    """ModelOptFp8MoEMethod selects its backend for static per-tensor activations, always."""
    return _fp8("fp8_static", method)


def _fp8_hf(method: Any, use_a16: Callable[[Any], bool]) -> Reading:
    """Fp8MoEMethod (quant_method fp8): block_quant, else its config's activation_scheme."""
    if getattr(method, "block_quant", False):
        return _fp8("fp8_block", method)
    scheme = getattr(getattr(method, "quant_config", None), "activation_scheme", None)
    if scheme not in ("static", "dynamic"):
        raise AdapterMismatch(f"Fp8MoEMethod's quant_config.activation_scheme is {scheme!r}: update "
                              "quantmatrix/adapter/families.py")
    return _fp8("fp8_static" if scheme == "static" else "fp8_dynamic", method)


def _fp8_ct(method: Any, use_a16: Callable[[Any], bool]) -> Reading:
    """CompressedTensorsW8A8Fp8MoEMethod: block_quant, else static_input_scales."""
    if not hasattr(method, "static_input_scales"):
        raise AdapterMismatch(f"{type(method).__name__} has no static_input_scales: update "
                              "quantmatrix/adapter/families.py")
    if getattr(method, "block_quant", False):
        return _fp8("fp8_block", method)
    return _fp8("fp8_static" if method.static_input_scales else "fp8_dynamic", method)


# vLLM MoE method class -> its family's reader
READERS: dict[str, Callable[[Any, Callable[[Any], bool]], Reading]] = {
    "ModelOptNvFp4FusedMoE": _nvfp4,
    "CompressedTensorsW4A4Nvfp4MoEMethod": _nvfp4,
    "ModelOptFp8MoEMethod": _fp8_modelopt,
    "Fp8MoEMethod": _fp8_hf,
    "CompressedTensorsW8A8Fp8MoEMethod": _fp8_ct,
    "UnquantizedFusedMoEMethod": _unquantized,
}


def read(method: Any, use_a16: Callable[[Any], bool]) -> Reading:
    """The family reading of a built MoE method; a method no row names is a vLLM (or a scheme) quantmatrix has
    not been taught, and fails loudly."""
    name = type(method).__name__
    reader = READERS.get(name)
    if reader is None:
        raise AdapterMismatch(f"MoE method {name} is in no family quantmatrix knows ({', '.join(READERS)}): add its "
                              "reader to quantmatrix/adapter/families.py")
    return reader(method, use_a16)
