"""kernel_format on a host without CUDA: vLLM's own post-load conversion runs with only its CUDA-only kernels
replaced (adapter.standins), so what it keeps and folds is observed. The stand-ins keep each op's shape and dtype and
are undone on exit; the conversion they enable is red on a checkpoint whose scales fold into non-finite alphas."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from quantmatrix.adapter import standins

try:
    from vllm import _custom_ops as ops
except ImportError as e:  # CI errors instead of skipping (.ci/run sets CI=1): a skip would hide lost coverage
    if os.environ.get("CI"):
        raise ImportError(f"vLLM is not importable ({e}): under CI the kernel-format stand-ins must run") from e
    pytest.skip(f"needs vLLM ({e})", allow_module_level=True)


def test_marlin_repack_stand_in_keeps_the_words_in_marlins_shape_and_refuses_a_wrong_size():
    packed = torch.arange(64 * 256 // 8, dtype=torch.int32).reshape(64 // 8, 256)  # 64 x 256 int4, packed along k
    with standins.standing_in() as used:
        out = ops.gptq_marlin_repack(packed, size_k=64, size_n=256, num_bits=4)
        with pytest.raises(ValueError, match="does not hold a 64 x 128 4-bit weight"):
            ops.gptq_marlin_repack(packed, size_k=64, size_n=128, num_bits=4)
    assert out.shape == (64 // 16, 256 * 16 // 8) and out.dtype == torch.int32
    assert torch.equal(out.flatten(), packed.flatten())
    assert used == [standins.MARLIN_REPACK]


def test_marlin_moe_repack_stand_ins_keep_each_expert_s_words_and_refuse_a_wrong_size():
    gptq = torch.arange(3 * (128 // 8) * 64, dtype=torch.int32).reshape(3, 128 // 8, 64)  # k 128 x n 64, along k
    awq = gptq.reshape(3, 128, 64 // 8)  # the same words packed along n
    with standins.standing_in() as used:
        out = ops.gptq_marlin_moe_repack(gptq, 128, 64, 4)
        awq_out = ops.awq_marlin_moe_repack(awq, 128, 64, 4)
        with pytest.raises(ValueError, match="does not hold 3 128 x 128 4-bit weights"):
            ops.gptq_marlin_moe_repack(gptq, 128, 128, 4)
    assert out.shape == awq_out.shape == (3, 128 // 16, 64 * 4 // 2) and out.dtype == torch.int32
    assert torch.equal(out.flatten(), gptq.flatten()) and torch.equal(awq_out.flatten(), awq.flatten())
    assert used == [standins.MARLIN_MOE_REPACK]


def test_marlin_repack_stand_in_takes_the_arguments_of_the_op_it_replaces():
    """vLLM before 0.29 passes act-order's `perm` second: bound by the replaced op's signature, not by position."""
    def repack_before_029(b_q_weight: torch.Tensor, perm: torch.Tensor, size_k: int, size_n: int, num_bits: int,
                          is_a_8bit: bool = False) -> torch.Tensor:
        raise AssertionError("the stand-in replaces this op")

    packed = torch.arange(64 * 256 // 8, dtype=torch.int32).reshape(64 // 8, 256)
    stand_in = standins._marlin_repack(standins._Used(), repack_before_029)
    out = stand_in(packed, torch.empty(0, dtype=torch.int32), 64, 256, 4)
    assert out.shape == (64 // 16, 256 * 16 // 8) and torch.equal(out.flatten(), packed.flatten())
    with pytest.raises(TypeError):
        stand_in(packed, 64, 256, 4)  # 0.32's call, one argument short for this op


def test_fp8_quant_stand_in_is_per_tensor_quantization_and_refuses_what_it_does_not_cover():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    scale = torch.tensor([0.01])
    with standins.standing_in():
        q, s = ops.scaled_fp8_quant(x, scale)
        dq, ds = ops.scaled_fp8_quant(x)
        with pytest.raises(NotImplementedError, match="per-tensor"):
            ops.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    assert s is scale and torch.equal(q, (x / 0.01).clamp(-448, 448).to(torch.float8_e4m3fn))
    assert torch.isclose(ds, x.abs().max() / 448).all() and dq.float().abs().max() == 448


def test_stand_ins_are_undone_on_exit_even_after_an_error():
    originals = (ops.gptq_marlin_repack, ops.gptq_marlin_moe_repack, ops.awq_marlin_moe_repack, ops.scaled_fp8_quant,
                 torch.Tensor.cuda)
    with pytest.raises(RuntimeError), standins.standing_in():
        assert torch.ones(1).cuda().device.type == "cpu"
        raise RuntimeError("conversion failed")
    assert (ops.gptq_marlin_repack, ops.gptq_marlin_moe_repack, ops.awq_marlin_moe_repack, ops.scaled_fp8_quant,
            torch.Tensor.cuda) == originals


# In a child process: a layer build imports vLLM's model code, which another test's in-process pytester run may
# have imported and dropped (its Rust extensions and registered ops cannot be imported twice in one process).
_CONVERT = """
import json, sys
from pathlib import Path
from quantmatrix.adapter import kernel, layers
from quantmatrix.checkpoints import store
from quantmatrix.checks.kernel import kernel_problem
from quantmatrix.measure import sentinel
from quantmatrix.schema.load import load
from quantmatrix.schema.synthetic import SyntheticSpec

root, out = Path(sys.argv[1]), Path(sys.argv[2])
backends = load(root / "matrices" / "default.yaml").moe_backends
down = "model.layers.0.mlp.experts.1.down_proj.input_scale"
answer = {}
for name, corrupt in (("healthy", ()), ("inf", ((down, "inf"),))):
    (out / name).mkdir()
    store.write(SyntheticSpec(model="qwen3_moe", producer="modelopt", scheme="nvfp4_w4a4", corrupt_tensors=corrupt),
                out / name)
    build = layers.build(out / name, (10, 0))
    build.layer.load(sentinel.checkpoint_tensors(out / name, build.layer.prefix)())
    kf = kernel.kernel_format(build.layer)
    answer[name] = [build.layer.backend, list(kf.stand_ins), list(kf.activation_scales),
                    kernel_problem(build, backends, kf, "sm100", "read")]
print(json.dumps(answer))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the stand-ins run only where torch has no CUDA")
def test_conversion_with_stand_ins_is_red_on_scales_that_fold_into_nonfinite_alphas(tmp_path: Path):
    """The W4A4 export with an inf input_scale (the matrix's bad-scale-values variant): vLLM's CUTLASS conversion,
    its device move stood in for, folds it into g2_alphas, and the check says so; the healthy export passes."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-c", _CONVERT, str(root), str(tmp_path)], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "QUANTMATRIX_CACHE": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    scales = ["a1_gscale", "a2_gscale"]
    assert answer["healthy"] == ["VLLM_CUTLASS", [standins.TO_DEVICE], scales, None]
    assert answer["inf"] == ["VLLM_CUTLASS", [standins.TO_DEVICE], scales, (
        "backend VLLM_CUTLASS on sm100: g2_alphas hold non-finite values after kernel-format conversion: every "
        "expert output through them is NaN or inf")]
