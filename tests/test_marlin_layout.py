"""quantmatrix.adapter.marlin_layout, restated from Marlin's tiling, is the inverse of vLLM's own scale permutation
(`marlin_permute_scales`, used here as the reference only): for any [groups, n] scales, grouped where there are
several groups and per-channel where there is one; and the two layouts are told apart, so scales laid out for the
wrong one never read back as the loaded ones."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quantmatrix.adapter import kernel, marlin_layout

try:
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_permute_scales
except ImportError as e:  # CI errors instead of skipping (.ci/run sets CI=1): a skip would hide lost coverage
    if os.environ.get("CI"):
        raise ImportError(f"vLLM is not importable ({e}): under CI the Marlin layout is checked against it") from e
    pytest.skip(f"needs vLLM ({e})", allow_module_level=True)

GROUP = 32


def _scales(groups: int, n: int, seed: int) -> torch.Tensor:
    return torch.randn(groups, n, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@settings(max_examples=60, deadline=None)
@given(groups=st.integers(1, 6), blocks=st.integers(1, 4), seed=st.integers(0, 2**16),
       channel_wise=st.booleans())
def test_unpermute_inverts_vllms_permutation(groups, blocks, seed, channel_wise):
    scales = _scales(1 if channel_wise else groups, 64 * blocks, seed)
    size_k = GROUP * scales.shape[0]
    permuted = marlin_permute_scales(scales, size_k, scales.shape[1], -1 if channel_wise else GROUP)
    layout = marlin_layout.layout_of(permuted)
    assert layout == ("grouped" if scales.shape[0] > 1 else "per-channel")
    assert torch.equal(marlin_layout.unpermute(permuted, layout), scales)


@settings(max_examples=30, deadline=None)
@given(groups=st.integers(2, 6), blocks=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_grouped_scales_laid_out_per_channel_do_not_read_back(groups, blocks, seed):
    scales = _scales(groups, 64 * blocks, seed)
    as_channel = marlin_permute_scales(scales, GROUP, scales.shape[1], GROUP)  # size_k == group: the wrong layout
    assert not torch.equal(marlin_layout.unpermute(as_channel, "grouped"), scales)
    assert torch.equal(marlin_layout.unpermute(as_channel, "per-channel"), scales)


def test_the_layouts_are_the_block_transposes_marlin_stores():
    columns = torch.arange(64).reshape(1, 64)
    stored = marlin_permute_scales(columns, 2 * GROUP, 64, GROUP)[0]
    assert [int(stored[8 * b + a]) for a in range(8) for b in range(8)] == list(range(64))  # column 8a + b at 8b + a
    single = marlin_permute_scales(columns[:, :32], GROUP, 32, GROUP)[0]
    assert [int(single[8 * i + 2 * m + b]) for m in range(4) for i in range(4) for b in range(2)] == list(range(32))
    with pytest.raises(ValueError, match="unknown Marlin scale layout"):
        marlin_layout.unpermute(columns, "tiled")
    assert marlin_layout.fits(columns, "grouped") and not marlin_layout.fits(columns[:, :32], "grouped")


# ------------------------------------------------------------------- adapter.kernel's reading of a converted layer

def _converted(loaded: torch.Tensor, group: int) -> torch.Tensor:
    """What a correct conversion makes of K-first [experts, groups, n] scales (vLLM's helper as the reference)."""
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_moe_permute_scales

    return marlin_moe_permute_scales(loaded, loaded.shape[1] * group, loaded.shape[2], group)


EXPERTS = (10, 11, 12, 13)  # a rank's global expert ids, by local row
WHY = ("every dequantized weight of those experts is scaled by another column's or group's scale")


def test_a_correct_conversion_reads_back_as_loaded_either_orientation_either_layout():
    grouped, channel = _scales(2, 128, 1).reshape(1, 2, 128).repeat(4, 1, 1), _scales(1, 128, 2).repeat(4, 1, 1)
    assert kernel.scale_finding("w13_scales", grouped, _converted(grouped, 64), False, EXPERTS) == ("w13_scales", None)
    assert kernel.scale_finding("w2_weight_scale", grouped.transpose(1, 2).contiguous(), _converted(grouped, 64), True,
                                EXPERTS) == ("w2_weight_scale", None)
    assert kernel.scale_finding("w2_scales", channel, _converted(channel, -1), False, EXPERTS) == ("w2_scales", None)


def test_one_expert_laid_out_per_channel_and_one_scrambled_are_named_by_global_id():
    loaded = torch.stack([_scales(2, 128, seed) for seed in range(4)])
    after = _converted(loaded, 64)
    after[2] = marlin_permute_scales(loaded[2], 64, 128, 64)  # size_k == group: per-channel
    assert kernel.scale_finding("w13_scales", loaded, after, False, EXPERTS) == ("w13_scales", (
        "w13_scales expert 12 (1 of 4): the kernel reads its 2 group rows of scales in Marlin's grouped order, but "
        f"they hold the loaded scales in Marlin's per-channel order: {WHY}"))
    after[1] = after[1].flip(1)
    assert kernel.scale_finding("w13_scales", loaded, after, False, EXPERTS)[1] == (
        "w13_scales expert 11, 12 (2 of 4): the kernel reads its 2 group rows of scales in Marlin's grouped order, "
        f"but they hold no order of the loaded scales Marlin reads: {WHY}")
    channel = _scales(1, 128, 5).repeat(4, 1, 1)
    wrong = _converted(channel, -1).flip(2)
    assert kernel.scale_finding("w2_scales", channel, wrong, False, ())[1] == (
        "w2_scales expert 0, 1, 2, 3 (4 of 4): the kernel reads its 1 group row of scales in Marlin's per-channel "
        f"order, but they hold no order of the loaded scales Marlin reads: {WHY}")


def test_padding_is_left_uncompared_and_lost_scales_or_untiled_widths_are_wrong():
    loaded = _scales(2, 128, 3).repeat(4, 1, 1).reshape(4, 2, 128)
    padded = torch.zeros(4, 4, 128, dtype=loaded.dtype)
    assert kernel.scale_finding("w2_scales", loaded, padded, False, EXPERTS) == (
        "w2_scales (not compared: padded from [4, 2, 128] to [4, 4, 128])", None)
    assert kernel.scale_finding("w2_scales", loaded, loaded[:, :, :64], False, EXPERTS)[1] == (
        "w2_scales is [4, 2, 64] after conversion, the loaded ones [4, 2, 128] (experts, groups, n): some of them are "
        "gone")
    narrow = loaded[:, :, :48].contiguous()
    assert kernel.scale_finding("w2_scales", narrow, narrow, False, EXPERTS)[1] == (
        "w2_scales [4, 2, 48]: n is no whole number of Marlin's grouped blocks")
