"""vLLM's own integer packing helpers (0.32: `quantization/utils/quant_utils.py`): the dequant_logits check unpacks
a GPTQ, AWQ or compressed-tensors int32 tensor with them, not with the factory's `schemes.wna16.pack_int32`, so a
slot-order or packing bug that the factory makes the same way when packing and unpacking still shows. AWQ's
interleave is read off vLLM's `awq_pack` (what its tests pack AWQ weights with), never spelled here."""

from __future__ import annotations

import importlib
from typing import Any

from quantmatrix.adapter.versions import versions
from quantmatrix.errors import AdapterMismatch

QUANT_UTILS = "vllm.model_executor.layers.quantization.utils.quant_utils"
SCALAR_TYPES = "vllm.scalar_type"


def _helper(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: no {module}.{name} ({e}); update "
                              "quantmatrix/adapter/wna16.py") from e


def _awq_slots(bits: int) -> list[int]:
    """Which input column each int32 slot holds in AWQ's packing: vLLM's awq_pack of the columns' own indices,
    unpacked slot by slot with unpack_cols."""
    import torch

    per = 32 // bits
    columns = torch.arange(per, dtype=torch.int32).reshape(1, per)
    packed = _helper(QUANT_UTILS, "awq_pack")(columns, bits, 1, per)
    return [int(v) for v in _helper(QUANT_UTILS, "unpack_cols")(packed, bits, 1, per)[0]]


def unpack(packed: Any, bits: int, packed_dim: int, slot_order: str) -> Any:
    """The unsigned codes of an int32 tensor packed along `packed_dim` (vLLM's
    unpack_quantized_values_into_int32), put back in column order for AWQ's interleaved slots."""
    wtype = getattr(importlib.import_module(SCALAR_TYPES).scalar_types, f"uint{bits}", None)
    if wtype is None:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: scalar_types has no uint{bits}; update "
                              "quantmatrix/adapter/wna16.py")
    codes = _helper(QUANT_UTILS, "unpack_quantized_values_into_int32")(packed, wtype, packed_dim)
    if slot_order == "sequential":
        return codes
    if slot_order != "awq":
        raise ValueError(f"unknown int32 slot order {slot_order!r}")
    slots = _awq_slots(bits)
    runs = codes.movedim(packed_dim, -1)
    runs = runs.reshape(*runs.shape[:-1], -1, len(slots))
    ordered = runs.clone()
    ordered[..., slots] = runs
    return ordered.reshape(*ordered.shape[:-2], -1).movedim(-1, packed_dim)
