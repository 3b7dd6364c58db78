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

from quantmatrix.adapter import marlin_layout

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
