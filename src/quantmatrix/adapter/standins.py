"""Stand-ins for the few CUDA-only kernels vLLM's post-load conversion calls, so that the conversion itself (which
scales it keeps, which it folds into the dequant alphas, which it drops) runs on a CPU host and is observed, not
assumed. Each stand-in keeps the op's output shape and dtype; none claims the kernel's data layout (a Marlin tile
order, a swizzle on the device), so the weights a converted layer holds are judged for presence and finiteness,
never run. The conversion's own Python (vLLM's code) runs unchanged around them: Marlin's scale permutation is
torch, not a stand-in, and adapter.kernel reads its result back. Used only where torch has no CUDA."""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Iterator
from typing import Any

from quantmatrix.adapter.versions import versions
from quantmatrix.errors import AdapterMismatch

CUSTOM_OPS = "vllm._custom_ops"
# What each stand-in replaces, as a case names it.
MARLIN_REPACK = "gptq_marlin_repack (Marlin tile repack: the packed words kept, reshaped to Marlin's shape)"
MARLIN_MOE_REPACK = ("gptq_marlin_moe_repack / awq_marlin_moe_repack (Marlin MoE tile repack: each expert's packed "
                     "words kept, reshaped to Marlin's shape)")
FP8_QUANT = "scaled_fp8_quant (static / per-tensor FP8 quantization, in torch)"
TO_DEVICE = "Tensor.cuda (the swizzled block scales stay on the CPU)"


class _Used:
    """Which stand-ins the conversion called, in call order, once each."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def add(self, name: str) -> None:
        if name not in self.names:
            self.names.append(name)


def _bound(op: Any) -> Any:
    """The arguments of a call to the installed op, by name: vLLM before 0.29 also passes act-order's row
    permutation `perm` second, a reordering within the tile layout the stand-ins do not claim."""
    signature = inspect.signature(op)
    return lambda *args, **kwargs: signature.bind(*args, **kwargs).arguments


def _marlin_repack(used: _Used, op: Any) -> Any:
    bind = _bound(op)

    def gptq_marlin_repack(*args: Any, **kwargs: Any) -> Any:
        """Marlin's repacked shape, [size_k / 16, size_n * 16 / (32 / num_bits)] int32, holding the same words."""
        used.add(MARLIN_REPACK)
        bound = bind(*args, **kwargs)
        b_q_weight, size_k, size_n, num_bits = (bound[n] for n in ("b_q_weight", "size_k", "size_n", "num_bits"))
        rows = size_k // 16
        if b_q_weight.numel() * 16 != size_k * size_n * num_bits // 2 or size_k % 16:
            raise ValueError(f"stand-in gptq_marlin_repack: {tuple(b_q_weight.shape)} int32 does not hold a "
                             f"{size_k} x {size_n} {num_bits}-bit weight")
        return b_q_weight.contiguous().reshape(rows, -1)
    return gptq_marlin_repack


def _marlin_moe_repack(used: _Used, op: Any) -> Any:
    bind = _bound(op)

    def marlin_moe_repack(*args: Any, **kwargs: Any) -> Any:
        """Per expert, Marlin's repacked shape [size_k / 16, size_n * num_bits / 2] int32, holding the same words
        (GPTQ packs along k, AWQ along n: either way an expert holds size_k * size_n * num_bits / 32 words)."""
        used.add(MARLIN_MOE_REPACK)
        bound = bind(*args, **kwargs)
        b_q_weight, size_k, size_n, num_bits = (bound[n] for n in ("b_q_weight", "size_k", "size_n", "num_bits"))
        experts = b_q_weight.shape[0]
        if b_q_weight.numel() * 32 != experts * size_k * size_n * num_bits or size_k % 16:
            raise ValueError(f"stand-in Marlin MoE repack: {tuple(b_q_weight.shape)} int32 does not hold {experts} "
                             f"{size_k} x {size_n} {num_bits}-bit weights")
        return b_q_weight.contiguous().reshape(experts, size_k // 16, -1)
    return marlin_moe_repack


def _fp8_quant(used: _Used, op: Any) -> Any:
    def scaled_fp8_quant(input: Any, scale: Any = None, num_token_padding: Any = None, scale_ub: Any = None,
                         use_per_token_if_dynamic: bool = False, output: Any = None, group_shape: Any = None) -> Any:
        """vLLM's per-tensor FP8 quantization (static scale, or a dynamic amax / 448 one): x / scale, saturated."""
        import torch

        used.add(FP8_QUANT)
        if num_token_padding or use_per_token_if_dynamic or group_shape is not None or scale_ub is not None:
            raise NotImplementedError("stand-in scaled_fp8_quant covers per-tensor quantization only")
        finfo = torch.finfo(torch.float8_e4m3fn)
        if scale is None:
            scale = (input.abs().amax().float() / finfo.max).clamp(min=1e-12).reshape(1)
        q = (input.float() / scale.float()).clamp(finfo.min, finfo.max).to(torch.float8_e4m3fn)
        if output is not None:
            output.copy_(q)
            q = output
        return q, scale
    return scaled_fp8_quant


@contextlib.contextmanager
def standing_in() -> Iterator[list[str]]:
    """Inside: vLLM's CUDA-only conversion kernels replaced by the stand-ins above; yields the names of those the
    conversion called (filled as it runs)."""
    import torch

    try:
        ops = importlib.import_module(CUSTOM_OPS)
    except ImportError as e:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: no {CUSTOM_OPS} ({e}); update "
                              "quantmatrix/adapter/standins.py") from e
    replaced = {"gptq_marlin_repack": _marlin_repack, "gptq_marlin_moe_repack": _marlin_moe_repack,
                "awq_marlin_moe_repack": _marlin_moe_repack, "scaled_fp8_quant": _fp8_quant}
    missing = [n for n in replaced if not hasattr(ops, n)]
    if missing:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: {CUSTOM_OPS} has no {', '.join(missing)}; "
                              "update quantmatrix/adapter/standins.py")
    used = _Used()
    saved = {n: getattr(ops, n) for n in replaced}
    cuda = torch.Tensor.cuda

    def to_device(self: Any, *args: Any, **kwargs: Any) -> Any:
        used.add(TO_DEVICE)
        return self

    try:
        for name, make in replaced.items():
            setattr(ops, name, make(used, saved[name]))
        torch.Tensor.cuda = to_device  # type: ignore[method-assign]
        yield used.names
    finally:
        for name, fn in saved.items():
            setattr(ops, name, fn)
        torch.Tensor.cuda = cuda  # type: ignore[method-assign]
