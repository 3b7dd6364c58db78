"""The FP8 scheme: its numerics (per-tensor, per-channel and 128x128 block scales), each producer's export as the
lint reads it, and each malformed variant named per tensor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quantmatrix.checkpoints import lint, store
from quantmatrix.checkpoints.schemes import fp8
from quantmatrix.schema.synthetic import SyntheticSpec


def build(tmp_path: Path, name: str = "ck", **fields) -> Path:
    out = tmp_path / name
    out.mkdir()
    store.write(SyntheticSpec(**fields), out)
    return out


@pytest.mark.parametrize(("granularity", "shape"), [("tensor", ()), ("channel", (300, 1)), ("block", (3, 2))])
def test_quantize_round_trips_within_e4m3_precision(granularity, shape):
    """float(q) * scale recovers w to E4M3's 3 mantissa bits; the block grid covers ragged edge blocks."""
    w = torch.randn(300, 200, generator=torch.Generator().manual_seed(0))
    scale = fp8.weight_scale(w, granularity)
    assert tuple(scale.shape) == shape
    q = fp8.quantize(w, scale)
    assert q.dtype == torch.float8_e4m3fn
    back = fp8.dequantize(q, scale, torch.float32)
    assert ((back - w).abs() <= w.abs() * 2**-4 + 1e-3).all()


@pytest.mark.parametrize(("granularity", "family"), [("tensor", "fp8"), ("channel", "fp8"), ("block", "fp8_block")])
def test_dequant_logits_decodes_with_vllms_scaled_dequantize_as_the_factory_encoded(granularity, family):
    """dequant_logits' FP8 decode (vLLM's scaled_dequantize, a ragged block edge padded) gives back exactly the
    factory's own decode of every layout; a block grid read transposed does not."""
    from quantmatrix.checkpoints.lint import Declared
    from quantmatrix.measure import dequant

    w = torch.randn(300, 200, generator=torch.Generator().manual_seed(1))
    scale = fp8.weight_scale(w, granularity)
    q = fp8.quantize(w, scale)
    leaf = "weight_scale_inv" if family == "fp8_block" else "weight_scale"
    d = Declared("fp8", "fp8_dynamic", "", (), family=family)
    state = dequant._fp8_state(Path("ck"), d, {"m.weight": q, f"m.{leaf}": scale})
    assert torch.equal(state["m.weight"], fp8.dequantize(q, scale, torch.bfloat16))
    if family == "fp8_block":
        square = fp8.weight_scale(torch.randn(256, 256, generator=torch.Generator().manual_seed(2)) *
                                  torch.tensor([[1.0], [50.0]]).repeat_interleave(128, 0), "block")
        wq = fp8.quantize(torch.ones(256, 256), square)
        flipped = dequant._fp8_state(Path("ck"), d, {"m.weight": wq, f"m.{leaf}": square.T.contiguous()})
        assert not torch.equal(flipped["m.weight"], fp8.dequantize(wq, square, torch.bfloat16))


def test_block_scale_is_each_blocks_amax_over_448():
    w = torch.zeros(256, 256)
    w[200, 10] = 448.0 * 3
    scale = fp8.weight_scale(w, "block")
    assert scale[1, 0] == 3.0 and scale[0, 0] == 1 / 448  # an all-zero block keeps a usable scale


@pytest.mark.parametrize(("fields", "scheme"), [
    (dict(producer="modelopt", scheme="fp8_static"), "fp8_static"),
    (dict(producer="modelopt", scheme="fp8_static", form="legacy"), "fp8_static"),
    (dict(producer="compressed-tensors", scheme="fp8_static"), "fp8_static"),
    (dict(producer="compressed-tensors", scheme="fp8_dynamic"), "fp8_dynamic"),
    (dict(producer="compressed-tensors", scheme="fp8_block", size="block_tiny"), "fp8_block"),
    (dict(producer="fp8", scheme="fp8_static"), "fp8_static"),
    (dict(producer="fp8", scheme="fp8_block", size="block_tiny"), "fp8_block"),
], ids=lambda f: "-".join(str(v) for v in f.values()) if isinstance(f, dict) else f)
def test_sound_fp8_exports_are_clean(tmp_path, fields, scheme):
    report = lint.lint(build(tmp_path, **fields), block_scales=True)
    assert report.findings == [] and report.declared.scheme == scheme, report.render()
    assert report.nvfp4_modules == 24 and "24 FP8 modules" in report.render()


def test_static_without_input_scales_names_every_expert(tmp_path):
    report = lint.lint(build(tmp_path, producer="fp8", scheme="fp8_static", input_scales="absent"))
    assert {f.code for f in report.findings} == {"missing_tensor"} and len(report.findings) == 24
    assert all(f.tensor == "input_scale" and "static FP8 MoE kernels read one" in f.message for f in report.findings)


def test_dynamic_with_stray_input_scales(tmp_path):
    report = lint.lint(build(tmp_path, producer="compressed-tensors", scheme="fp8_dynamic", input_scales="present"))
    assert {(f.code, f.tensor) for f in report.findings} == {("unexpected_tensor", "input_scale")}


def test_block_grid_one_block_short_and_a_scale_of_the_wrong_dtype(tmp_path):
    short = "model.layers.0.mlp.experts.1.up_proj.weight_scale_inv"
    report = lint.lint(build(tmp_path, producer="fp8", scheme="fp8_block", size="block_tiny",
                             corrupt_tensors=((short, "shape"),)))
    assert [(f.code, f.name) for f in report.findings] == [("bad_shape", short)]
    assert "is [2, 1], expected [2, 2]" in report.findings[0].message
    wrong = "model.layers.1.mlp.experts.0.down_proj.weight_scale"
    report = lint.lint(build(tmp_path, "wrong", producer="modelopt", scheme="fp8_static",
                             corrupt_tensors=((wrong, "dtype"),)))
    assert [(f.code, f.name) for f in report.findings] == [("bad_dtype", wrong)]


def test_bad_fp8_scale_values_are_named(tmp_path):
    zero = "model.layers.0.mlp.experts.3.gate_proj.input_scale"
    nan = "model.layers.1.mlp.experts.2.down_proj.weight_scale"
    report = lint.lint(build(tmp_path, producer="modelopt", scheme="fp8_static",
                             corrupt_tensors=((zero, "zero"), (nan, "nan"))))
    assert {(f.code, f.name) for f in report.findings} == {("bad_value", nan), ("bad_value", zero)}


@pytest.mark.parametrize(("producer", "scheme"), [("modelopt", "fp8_dynamic"), ("fp8", "fp8_dynamic")])
def test_a_producer_refuses_a_format_it_does_not_write(tmp_path, producer, scheme):
    with pytest.raises(ValueError, match="ModelOpt exports no fp8_dynamic|not the per-channel"):
        build(tmp_path, producer=producer, scheme=scheme)


def _method(cls: str, **attrs):
    """A stand-in carrying only the class name and attributes families.read looks at (the real methods are built
    by the cpu tier's layer_dispatch on every arch)."""
    return type(cls, (), attrs)()


def test_families_name_each_fp8_read_set_by_activation_scheme():
    import enum

    from quantmatrix.adapter import families

    backend = enum.Enum("Fp8MoeBackend", {"TRITON": "TRITON"}).TRITON
    no_a16 = lambda m: False  # noqa: E731
    static = families.read(_method("ModelOptFp8MoEMethod", fp8_backend=backend), no_a16)
    assert (static.scheme, static.backend, static.weight_only) == ("fp8_static", "FP8_TRITON", False)
    dyn = families.read(_method("CompressedTensorsW8A8Fp8MoEMethod", fp8_backend=backend, static_input_scales=False,
                                block_quant=False), no_a16)
    assert (dyn.scheme, dyn.backend) == ("fp8_dynamic", "FP8_DYNAMIC_TRITON")
    block = families.read(_method("Fp8MoEMethod", fp8_backend=backend, block_quant=True), no_a16)
    assert (block.scheme, block.backend) == ("fp8_block", "FP8_DYNAMIC_TRITON")
    with pytest.raises(families.AdapterMismatch, match="CompressedTensorsW8A8Int8MoEMethod is in no family"):
        families.read(_method("CompressedTensorsW8A8Int8MoEMethod"), no_a16)
