"""The faults a spec plants in a checkpoint's tensors (`omit_tensors`, `corrupt_tensors`): producer-independent
data, applied by the factory to whatever tensors the scheme and producer wrote, bf16 weights included (the e2e
tier's broken canaries)."""

from __future__ import annotations

import fnmatch

import torch

from quantmatrix.checkpoints.producers import role_of
from quantmatrix.errors import MatrixError
from quantmatrix.schema.synthetic import SyntheticSpec


def apply(spec: SyntheticSpec, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of `tensors` with the spec's omissions, then its corruptions."""
    out = dict(tensors)
    _omit(spec, out)
    _corrupt(spec, out)
    return out


def _matching(pattern: str, tensors: dict[str, torch.Tensor], flag: str) -> list[str]:
    hits = [k for k in tensors if fnmatch.fnmatchcase(k, pattern)]
    if not hits:
        sample = next((k for k in tensors if "experts" in k and "scale" in k), next(iter(tensors)))
        raise MatrixError(f"synthetic.{flag}: {pattern!r} matches no tensor of this checkpoint "
                          f"(names look like {sample!r})")
    return hits


def _omit(spec: SyntheticSpec, tensors: dict[str, torch.Tensor]) -> None:
    for pattern in spec.omit_tensors:
        for name in _matching(pattern, tensors, "omit_tensors"):
            del tensors[name]


def _corrupt(spec: SyntheticSpec, tensors: dict[str, torch.Tensor]) -> None:
    """zero / inf / nan overwrite every element (nan on a uint8 block scale: the byte 0xFF, E8M0's NaN, as an
    MXFP4 scale holds it); shape drops the last column (or doubles a scalar); dtype stores the tensor as
    float8_e4m3fn."""
    for pattern, fault in spec.corrupt_tensors:
        for name in _matching(pattern, tensors, "corrupt_tensors"):
            t = tensors[name]
            if fault == "shape":
                tensors[name] = t.reshape(1).repeat(2) if t.numel() == 1 else t[..., :-1].contiguous()
                continue
            if fault == "dtype":
                if t.dtype == torch.float8_e4m3fn or not t.is_floating_point():
                    raise MatrixError(f"synthetic.corrupt_tensors: {name} is {t.dtype}; a dtype fault stores a "
                                      "floating scale as float8_e4m3fn")
                tensors[name] = t.to(torch.float8_e4m3fn)
                continue
            if fault == "nan" and t.dtype == torch.uint8 and role_of(name) == "block_scale":
                tensors[name] = torch.full_like(t, 0xFF)
                continue
            if not t.is_floating_point() and fault != "zero":
                raise MatrixError(f"synthetic.corrupt_tensors: {name} is {t.dtype}; a {fault} fault needs a "
                                  "floating tensor (a scale); an integer one takes zero (an E8M0 scale nan too)")
            if fault == "inf" and t.dtype == torch.float8_e4m3fn:
                raise MatrixError(f"synthetic.corrupt_tensors: {name} is float8_e4m3fn, which has no inf "
                                  "(E4M3FN saturates or turns into NaN); use nan or zero")
            value = {"zero": 0.0, "inf": float("inf"), "nan": float("nan")}[fault]
            tensors[name] = torch.full_like(t.float(), value).to(t.dtype)
