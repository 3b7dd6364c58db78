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


# How vLLM's WNA16 MoE methods store what their weight_loaders write (before process_weights_after_loading), per
# parameter leaf: (packing, the axis of an expert row the codes are packed along, whether the row is stored input
# axis first, the offset to add to a stored zero point). Packing "bytes": MoeWNA16Method's standard format
# (moe_wna16.py moe_wna16_weight_loader: GPTQ and AWQ converted to [out, in] rows, 8 // bits codes per uint8, low
# bits first; zero points packed along the outputs, GPTQ's already + 1); "sequential" / "awq": int32 words in that
# slot order (compressed-tensors keeps its checkpoint's packing; AutoGPTQMoEMethod and AutoAWQMoEMethod, Marlin's,
# keep GPTQ's and AWQ's own, input axis first, GPTQ's v1 zero points still - 1); None: values unpacked. Leaves not
# named are stored as their logical [out, in or groups] values. A method whose instance says `is_transposed` keeps
# its rows input axis first (storage()): vLLM 0.28's CompressedTensorsWNA16MoEMethod on every backend but FlashInfer
# TRT-LLM's (Marlin's [in / 8, out] words, [groups, out] scales, [groups, out / 8] zero points); 0.32's never.
STORED = {"MoeWNA16Method": {"qweight": ("bytes", 1, False, 0), "qzeros": ("bytes", 0, False, 0)},
          "CompressedTensorsWNA16MoEMethod": {"weight_packed": ("sequential", 1, False, 0),
                                              "weight_zero_point": ("sequential", 0, False, 0)},
          "AutoGPTQMoEMethod": {"qweight": ("sequential", 0, True, 0), "qzeros": ("sequential", 1, True, 1),
                                "scales": (None, 0, True, 0)},
          "AutoAWQMoEMethod": {"qweight": ("awq", 1, True, 0), "qzeros": ("awq", 1, True, 0),
                               "scales": (None, 0, True, 0)},
          "CompressedTensorsWNA16MoEMethod transposed": {"weight_packed": ("sequential", 0, True, 0),
                                                         "weight_zero_point": ("sequential", 1, True, 0),
                                                         "weight_scale": (None, 0, True, 0)}}
_TRANSPOSABLE = ("CompressedTensorsWNA16MoEMethod",)


def storage(experts: Any) -> str:
    """The STORED entry a built MoE block's parameters follow: its method's class, and for a method that stores
    either way, whether this instance stores its rows input axis first."""
    method = experts.quant_method
    name = type(method).__name__
    if name in _TRANSPOSABLE and getattr(method, "is_transposed", False):
        return f"{name} transposed"
    return name


def unpack_bytes(packed: Any, bits: int, dim: int) -> Any:
    """The unsigned codes of a uint8 tensor holding 8 // bits codes per byte along `dim`, low bits first."""
    import torch

    per = 8 // bits
    runs = packed.movedim(dim, -1).to(torch.int32)
    codes = torch.stack([(runs >> (bits * k)) & ((1 << bits) - 1) for k in range(per)], dim=-1)
    return codes.reshape(*runs.shape[:-1], -1).movedim(-1, dim)


def logical_param(method: str, leaf: str, stored: Any, bits: int) -> Any:
    """A fused expert parameter (experts first) as the logical codes, zero points or scales its rows hold
    ([experts, out, in or groups]), undoing the method's storage (STORED, keyed by storage()); unchanged where it
    stores them plain. Int32 words of a method STORED does not know would be compared raw, their packing read as the
    checkpoint's: an AdapterMismatch (plain int8 values, e.g. W8A8's, need no entry)."""
    import torch

    if method not in STORED and stored.dtype == torch.int32:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: how MoE method {method} stores packed integer "
                              "weights is unknown; add it to STORED in quantmatrix/adapter/wna16.py")
    how = STORED.get(method, {}).get(leaf)
    if how is None or stored.dim() < 3:
        return stored
    packing, axis, transposed, offset = how
    if packing == "bytes":
        stored = unpack_bytes(stored, bits, axis + 1)
    elif packing is not None:
        stored = unpack(stored, bits, axis + 1, packing)
    stored = stored.transpose(-1, -2) if transposed else stored
    return stored + offset if offset else stored
