"""How each family of vLLM's MoE quant methods says what it built: the activation scheme it runs (in the
matrix's `resolves_to` words, schema.vocab.RESOLUTIONS) and the name of the read-set (package data backends.yaml)
that describes the kernel backend it selected.

One row per vLLM MoE method class. A new scheme family (FP8, WNA16, ...) is a reader function and its rows here;
the layer builder (adapter.layers) and every check read `MoELayer.scheme` / `.backend` and never a vLLM attribute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
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
    return Reading(scheme, READ_SET_PREFIX[scheme] + _enum_name(getattr(method, "fp8_backend", None)), False)


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


def _int8_ct(method: Any, use_a16: Callable[[Any], bool]) -> Reading:
    """CompressedTensorsW8A8Int8MoEMethod: channel-wise int8 weights, dynamic per-token int8 activations (it refuses
    static ones), the `int8_backend` enum as INT8_<backend>."""
    if not hasattr(method, "int8_backend"):
        raise AdapterMismatch(f"{type(method).__name__} has no int8_backend: update quantmatrix/adapter/families.py")
    return Reading("w8a8_int8", READ_SET_PREFIX["w8a8_int8"] + _enum_name(method.int8_backend), False)


def _wna16(method: Any, use_a16: Callable[[Any], bool]) -> Reading:
    """Integer weight-only (GPTQ, AWQ, compressed-tensors W4A16/W8A16): bf16 activations always; the
    `WNA16MoEBackend` enum (MoeWNA16Method and compressed-tensors keep it as wna16_backend, the GPTQ and AWQ Marlin
    methods as wna16_moe_backend), its read-set named WNA16_<backend>."""
    backend = getattr(method, "wna16_backend", None) or getattr(method, "wna16_moe_backend", None)
    if backend is None:
        raise AdapterMismatch(f"{type(method).__name__} keeps no WNA16 backend (wna16_backend, wna16_moe_backend): "
                              "update quantmatrix/adapter/families.py")
    return Reading("weight_only", READ_SET_PREFIX["wna16"] + _enum_name(backend), True)


# MXFP4 backends (vLLM 0.32 fused_moe/oracle/mxfp4.py Mxfp4MoeBackend) that quantize the activations themselves
# (MXFP8, MXFP4 or FP8); every other one runs them bf16
_MXFP4_QUANTIZED_ACTIVATIONS = ("_MXFP8", "MXFP4_MXFP4", "MXFP4_FP8", "DEEPGEMM_MXFP4")


def _mxfp4(method: Any, use_a16: Callable[[Any], bool]) -> Reading:
    """GptOssMxfp4MoEMethod: the `mxfp4_backend` enum, its read-set MXFP4_<backend> (MXFP4_MARLIN, ...)."""
    backend = _enum_name(getattr(method, "mxfp4_backend", None))
    quantized = any(s in backend for s in _MXFP4_QUANTIZED_ACTIVATIONS)
    return Reading("mxfp4", READ_SET_PREFIX["mxfp4"] + backend, not quantized)


# MXFP8 backends (vLLM 0.32 fused_moe/oracle/mxfp8.py, Fp8MoeBackend values) that run the activations bf16; every
# other one quantizes them to MXFP8 itself (the checkpoint holds no activation scale either way)
_MXFP8_BF16_ACTIVATIONS = ("MARLIN",)


def _mxfp8(method: Any, use_a16: Callable[[Any], bool]) -> Reading:
    """ModelOptMxFp8FusedMoE: the `mxfp8_backend` enum (an Fp8MoeBackend), its read-set MXFP8_<backend>."""
    if not hasattr(method, "mxfp8_backend"):
        raise AdapterMismatch(f"{type(method).__name__} has no mxfp8_backend: update quantmatrix/adapter/families.py")
    backend = _enum_name(method.mxfp8_backend)
    return Reading("mxfp8", READ_SET_PREFIX["mxfp8"] + backend, backend in _MXFP8_BF16_ACTIVATIONS)


# resolves_to word -> how its readers name a backend's read-set in backends.yaml: the prefix before vLLM's enum
# name (a read-set belongs to the word with the longest prefix it starts with); None: no kernel backend
READ_SET_PREFIX: dict[str, str | None] = {
    "weight_only": "", "w4a4": "",
    "fp8_static": "FP8_", "fp8_dynamic": "FP8_DYNAMIC_", "fp8_block": "FP8_DYNAMIC_", "w8a8_int8": "INT8_",
    "mxfp4": "MXFP4_", "mxfp8": "MXFP8_",
    "unquantized": None,
    # integer weight-only resolves to weight_only too; its read-sets are a family apart (read_set_word)
    "wna16": "WNA16_",
}
# factory scheme module (schema.factory) -> the READ_SET_PREFIX row its weight-only read-sets are named by
_FAMILY_WORDS = {"wna16": "wna16"}


def read_set_word(resolves_to: str, scheme_module: str | None) -> str:
    """The READ_SET_PREFIX row a checkpoint's read-sets are found under: its resolves_to word, except where a
    scheme family names its own backends (WNA16_*: integer weight-only resolves to weight_only, as NVFP4 does)."""
    return _FAMILY_WORDS.get(scheme_module or "", resolves_to) if resolves_to == "weight_only" else resolves_to


def read_sets(scheme: str, names: Iterable[str]) -> list[str] | None:
    """The read-set names (of `names`) a method running `scheme` can report, by READ_SET_PREFIX; None where the
    scheme runs no kernel backend. A word no row names is a scheme quantmatrix has not been taught."""
    if scheme not in READ_SET_PREFIX:
        raise AdapterMismatch(f"resolves_to {scheme!r} has no READ_SET_PREFIX row: add it to "
                              "quantmatrix/adapter/families.py")
    prefix = READ_SET_PREFIX[scheme]
    if prefix is None:
        return None
    prefixes = {p for p in READ_SET_PREFIX.values() if p is not None}
    return [n for n in names if max((p for p in prefixes if n.startswith(p)), key=len) == prefix]


# vLLM MoE method class -> its family's reader
READERS: dict[str, Callable[[Any, Callable[[Any], bool]], Reading]] = {
    "ModelOptNvFp4FusedMoE": _nvfp4,
    "CompressedTensorsW4A4Nvfp4MoEMethod": _nvfp4,
    "ModelOptFp8MoEMethod": _fp8_modelopt,
    "Fp8MoEMethod": _fp8_hf,
    "CompressedTensorsW8A8Fp8MoEMethod": _fp8_ct,
    "CompressedTensorsW8A8Int8MoEMethod": _int8_ct,
    "GptOssMxfp4MoEMethod": _mxfp4,
    "ModelOptMxFp8FusedMoE": _mxfp8,
    "UnquantizedFusedMoEMethod": _unquantized,
    "AutoGPTQMoEMethod": _wna16,
    "AutoAWQMoEMethod": _wna16,
    "MoeWNA16Method": _wna16,
    "CompressedTensorsWNA16MoEMethod": _wna16,
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
