"""The integer weight-only factory against the code it imitates: each producer's int32 packing bit for bit against
vLLM's packing helpers and compressed-tensors' own unpacking, and the decode dequant_logits runs (vLLM's unpacking,
the producers' layout tables) against the factory's own reference numbers, for every producer and variant."""

from __future__ import annotations

import importlib
import types

import pytest
import torch

from quantmatrix.adapter.declared import IntWeights
from quantmatrix.checkpoints import producers
from quantmatrix.checkpoints.lint import Declared
from quantmatrix.checkpoints.producers import awq, compressed_tensors, gptq
from quantmatrix.checkpoints.schemes import wna16
from quantmatrix.measure import dequant
from quantmatrix.schema.synthetic import SyntheticSpec

QUANT_UTILS = importlib.import_module("vllm.model_executor.layers.quantization.utils.quant_utils")


def _weight(rows: int = 16, cols: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return (torch.randn(rows, cols, generator=g) / 8).to(torch.bfloat16)


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_packing_is_vllms(bits):
    q = wna16.quantize(_weight(), bits, 32, symmetric=True)
    ours = gptq.RECIPES["wna16"].tensors(q, SyntheticSpec("gptq", f"wna16_int{bits}_g32"))
    assert torch.equal(ours["weight"], QUANT_UTILS.gptq_pack(q.codes.T.contiguous(), bits, 64, 16))
    assert torch.equal(ours["zero_point"], QUANT_UTILS.pack_cols(q.zero.T.contiguous() - 1, bits, 2, 16))


def test_awq_packing_is_vllms_awq_pack():
    q = wna16.quantize(_weight(), 4, 32, symmetric=False)
    ours = awq.RECIPES["wna16"].tensors(q, SyntheticSpec("awq", "wna16_int4_g32"))
    assert torch.equal(ours["weight"], QUANT_UTILS.awq_pack(q.codes.T.contiguous(), 4, 64, 16))
    assert torch.equal(ours["zero_point"], QUANT_UTILS.awq_pack(q.zero.T.contiguous(), 4, 2, 16))
    wrong = awq.RECIPES["wna16"].tensors(q, SyntheticSpec("awq", "wna16_int4_g32", zero_point_order="gptq"))
    assert torch.equal(wrong["zero_point"], QUANT_UTILS.pack_cols(q.zero.T.contiguous(), 4, 2, 16))


def test_compressed_tensors_packing_unpacks_with_the_package():
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    q = wna16.quantize(_weight(), 4, 32, symmetric=True)
    ours = compressed_tensors.RECIPES["wna16"].tensors(q, SyntheticSpec("compressed-tensors", "wna16_int4_g32"))
    signed = unpack_from_int32(ours["weight"], 4, torch.Size(q.codes.shape))
    assert torch.equal(signed.to(torch.int32) + 8, q.codes)
    assert ours["weight_shape"].tolist() == [16, 64]


@pytest.mark.parametrize(("producer", "scheme"), [
    ("gptq", "wna16_int4_g32"), ("gptq", "wna16_int8_g32"), ("gptq", "wna16_int4_channel"),
    ("gptq", "wna16_int4_g32_actorder"), ("gptq", "wna16_int4_g48"), ("awq", "wna16_int4_g32"),
    ("compressed-tensors", "wna16_int4_g32"), ("compressed-tensors", "wna16_int8_channel"),
    ("compressed-tensors", "wna16_int4_g32_actorder"),
])
def test_the_check_decodes_what_the_factory_encoded(producer, scheme, tmp_path):
    """dequant_logits' decode (vLLM's unpacking, the producer's SHAPES and PACKING tables) gives back exactly the
    bf16 weight the factory's reference arithmetic says the stored tensors hold."""
    spec = SyntheticSpec(producer, scheme)
    module = producers.producer(producer)
    export = module.RECIPES["wna16"]
    w = _weight()
    p = wna16.params(spec)
    q = wna16.quantize(w, p.bits, p.group_size, export.symmetric, wna16.activation_order(w) if p.actorder else None)
    names = module.LEAVES["wna16"]
    tensors = {f"m.{names[role]}": t for role, t in export.tensors(q, spec).items()}
    weights = IntWeights(p.bits, p.group_size, p.actorder, export.symmetric)
    state = dequant._wna16_state(tmp_path, Declared(producer, "weight_only", "", (), weights, "wna16"), tensors)
    assert torch.equal(state["m.weight"], wna16.dequantize(q, export.scale_dtype))


def test_activation_order_groups_a_permutation_of_the_grid():
    w = _weight(4, 64)
    order = wna16.activation_order(w)
    q = wna16.quantize(w, 4, 32, symmetric=True, order=order)
    assert sorted(q.g_idx.tolist()) == [0] * 32 + [1] * 32
    assert q.g_idx[order[:32].long()].tolist() == [0] * 32  # the first 32 inputs in the order form group 0


def test_transposed_compressed_tensors_storage_reads_back_the_same_codes():
    """vLLM 0.28's CompressedTensorsWNA16MoEMethod stores Marlin's rows input axis first ([in / 8, out] words,
    [groups, out / 8] zero points); read back through STORED they are the same logical codes as 0.32's N-first rows,
    and a method STORED does not know is an AdapterMismatch, never a raw comparison."""
    from quantmatrix.adapter import wna16 as adapter
    from quantmatrix.errors import AdapterMismatch

    codes = torch.randint(0, 16, (2, 16, 64), generator=torch.Generator().manual_seed(3))
    zeros = torch.randint(0, 16, (2, 16, 2), generator=torch.Generator().manual_seed(4))
    method = type("CompressedTensorsWNA16MoEMethod", (), {"is_transposed": True})()
    key = adapter.storage(types.SimpleNamespace(quant_method=method))
    assert key == "CompressedTensorsWNA16MoEMethod transposed"
    for leaf, values, packed_dim in (("weight_packed", codes, 2), ("weight_zero_point", zeros, 1)):
        flat = adapter.logical_param("CompressedTensorsWNA16MoEMethod", leaf,
                                     wna16.pack_int32(values, 4, packed_dim), 4)
        stored = wna16.pack_int32(values, 4, packed_dim).transpose(1, 2).contiguous()
        assert torch.equal(adapter.logical_param(key, leaf, stored, 4), flat)
        assert torch.equal(flat, values)
    with pytest.raises(AdapterMismatch, match="adapter/wna16.py"):
        adapter.logical_param("SomeNewWNA16MoEMethod", "weight_packed", codes.to(torch.int32), 4)
