"""The hand-made Marlin MoE bug (tests/marlin_bug.py: grouped scales permuted with the wrong size), installed in a
child pytest over the real cpu tier: kernel_format turns the Marlin cases red naming both scale tensors and the
experts, at one rank and at each rank of expert parallel 2 (each naming its own experts), and leaves the case the
bug cannot touch (a WNA16 MoE on Triton) green; the same cases are green on the unchanged vLLM. (At tp 2 vLLM 0.32's
own w13 permutation is wrong for this checkpoint: the matrix waives that case, see matrices/default.yaml.)"""

from __future__ import annotations

import os
from pathlib import Path

import marlin_bug
import pytest
import vllm_patch

MARLIN, TRITON, AT = "qwen3moe-tiny-gptq-w4a16-g64-marlin", "qwen3moe-tiny-gptq-w4a16-g32", "sm90-default"
CASES = (f"{MARLIN}@{AT}", f"{MARLIN}@{AT}-tp2_ep", f"{TRITON}@{AT}")
WHY = ("of scales in Marlin's grouped order, but they hold the loaded scales in Marlin's per-channel order: every "
       "dequantized weight of those experts is scaled by another column's or group's scale")


def _child(tmp: Path, env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """One child pytest over CASES' kernel_format: case -> (outcome, message)."""
    out = vllm_patch.child_pytest(tmp, [f"suites/test_layers.py::test_kernel_format[{case}]" for case in CASES], env)
    return {node.split("[", 1)[1].removesuffix("]"): result for node, result in out.items()}


@pytest.fixture(scope="module")
def bugged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("marlin-bug")
    return _child(tmp, {**os.environ, **marlin_bug.install(tmp)})


@pytest.fixture(scope="module")
def unchanged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    return _child(tmp_path_factory.mktemp("marlin-unchanged"), dict(os.environ))


def test_the_same_cases_are_green_on_the_unchanged_vllm(unchanged):
    assert unchanged == {case: ("passed", "") for case in CASES}


def test_the_wna16_moe_on_triton_is_untouched_by_the_bug(bugged):
    assert bugged[f"{TRITON}@{AT}"] == ("passed", "")


def test_grouped_scales_permuted_with_the_wrong_size_are_red_naming_each_scale_tensor_and_the_experts(bugged):
    outcome, message = bugged[f"{MARLIN}@{AT}"]
    assert outcome == "failed", message
    # measured: both tensors hold 2 groups of 64 along k (hidden 128, intermediate 128); the bug's size_k is 16
    assert message == (f"{MARLIN}@{AT} kernel_format: backend WNA16_MARLIN on sm90 (H100 / H200): read back through "
                       "Marlin's scale layout (adapter.marlin_layout), the converted scales are not the loaded ones: "
                       f"w13_scales expert 0, 1, 2, 3 (4 of 4): the kernel reads its 2 group rows {WHY}; "
                       f"w2_scales expert 0, 1, 2, 3 (4 of 4): the kernel reads its 2 group rows {WHY}"), message


def test_under_expert_parallel_each_rank_is_red_naming_its_own_experts(bugged):
    outcome, message = bugged[f"{MARLIN}@{AT}-tp2_ep"]
    assert outcome == "failed", message
    assert message.startswith(f"{MARLIN}@{AT}-tp2_ep kernel_format: "), message
    for rank, experts in ((0, "0, 1"), (1, "2, 3")):
        assert (f"rank {rank}: backend WNA16_MARLIN on sm90 (H100 / H200): read back through Marlin's scale layout "
                f"(adapter.marlin_layout), the converted scales are not the loaded ones: w13_scales expert {experts} "
                f"(2 of 2): the kernel reads its 2 group rows {WHY}; w2_scales expert {experts} (2 of 2)") in message, \
            message
