"""One layer's parameters measured against one backend's reads: the findings the post-load audit
(measure.sentinel, which finds unloaded elements with two sentinel fills) and the production guard (quantmatrix.guard,
which records what vLLM's weight loaders wrote) share. Each measures which elements were never loaded; this module
turns that mask and the loaded values into Findings (data, no verdict), so both name the same tensors, experts and
kinds; checks.audit judges them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from quantmatrix.adapter.roles import leaf
from quantmatrix.checkpoints.producers import role_of
from quantmatrix.measure.loaded import AuditReport, Finding

SCALE_ROLES = ("block_scale", "global_scale", "input_scale")


def tensor_role(name: str) -> str:
    """role_of, and for a scale no producer module names (FP8 block quantization's `weight_scale_inv`, any other
    `*scale`, `*scale_inv`, `*scale_2`) the block-scale role: judged as a scale (finite, not negative) and, when
    never loaded, counted as read by a backend that reads block scales. Every other name stays "other"."""
    role = role_of(name)
    if role != "other":
        return role
    lf = leaf(name)
    return "block_scale" if lf.endswith(("scale", "scale_inv", "scale_2")) and not lf.startswith(("k_", "v_", "q_")) \
        else "other"


def expert_rows(mask: torch.Tensor, num_experts: int) -> tuple[int, ...]:
    """Expert rows (dim 0) where `mask` holds anywhere; () for a tensor that is not indexed by expert."""
    if mask.dim() == 0 or mask.shape[0] != num_experts:
        return ()
    return tuple(int(i) for i in torch.nonzero(mask.reshape(num_experts, -1).any(dim=1)).flatten())


def measure_layer(params: Mapping[str, torch.Tensor], unloaded: Mapping[str, torch.Tensor], backend: str,
                reads: frozenset[str], single_input_scale: bool, num_experts: int,
                extra: Iterable[Finding] = (), global_experts: int = 0) -> AuditReport:
    """Findings for every parameter of one layer. `unloaded[name]` is a bool mask that broadcasts against the
    parameter (its full shape, one entry per expert row shaped [E, 1, ...], or a scalar). A rank's parameter whose
    dim 0 is `global_experts` (vLLM indexes it by global expert on every rank: FlashInfer's NVFP4 input scales under
    expert parallelism) names its rows by global expert."""
    findings = list(extra)
    loaded_names = set()
    for name, p in params.items():
        role = tensor_role(name)
        is_read = role in reads
        mask = unloaded[name]
        n_exp = global_experts if global_experts and p.dim() and p.shape[0] == global_experts else num_experts
        if mask.any():
            rows = expert_rows(mask, n_exp)
            share = (f"{int(mask.sum())}/{mask.numel()} elements" if mask.shape == p.shape
                     else f"{len(rows)}/{n_exp} experts" if rows else "not written")
            findings.append(Finding(name, role, "unloaded", rows, is_read, share))
        if not bool(mask.all()):
            loaded_names.add(name)
        if role in SCALE_ROLES:
            findings += _scale_findings(name, role, p, ~mask, n_exp, is_read, single_input_scale)
        elif p.dtype.is_floating_point:  # weights, and biases or router weights ("other"), which every forward reads
            findings += _weight_findings(name, role, p, ~mask, n_exp, is_read or role == "other")
    return AuditReport(backend, reads, tuple(findings), frozenset(loaded_names))


def _nonfinite_detail(values: torch.Tensor, bad: torch.Tensor) -> str:
    nan = int(torch.isnan(values).logical_and(bad).sum())
    inf = int(bad.sum()) - nan
    return ", ".join(w for w in (f"{nan} NaN" if nan else "", f"{inf} inf" if inf else "") if w)


_CHUNK = 1 << 26  # elements per isfinite() pass: bounds the transient bool tensor to 64 MiB


def finite_mask(values: torch.Tensor) -> torch.Tensor:
    """torch.isfinite for every dtype. The one-byte float formats are upcast to float32 first: torch implements
    isfinite for neither float8_e4m3fn nor the fnuz formats, and calls float8_e8m0fnu's NaN (0xff) finite (torch
    2.13). e2m1 (float4) has no NaN or inf encoding at all. Any other dtype torch cannot judge raises, and the guard
    then says it is NOT RUNNING rather than pass the model."""
    if values.dtype.is_floating_point and values.element_size() == 1:
        try:
            values = values.float()
        except (NotImplementedError, RuntimeError):
            if "e2m1" in str(values.dtype):
                return torch.ones(values.shape, dtype=torch.bool, device=values.device)
            raise
    return torch.isfinite(values)


def all_finite(values: torch.Tensor) -> bool:
    """One bandwidth-bound pass, in dim-0 chunks so a large expert tensor never needs a full-size mask (nor, for
    an FP8 tensor, a full-size float32 copy: its chunks are a quarter the size)."""
    chunk = _CHUNK // 4 if values.element_size() == 1 and values.dtype.is_floating_point else _CHUNK
    if values.dim() == 0 or values.numel() <= chunk:
        return bool(finite_mask(values).all())
    rows = max(1, chunk // max(1, values[0].numel()))
    return all(bool(finite_mask(values[i:i + rows]).all()) for i in range(0, values.shape[0], rows))


def _weight_findings(name: str, role: str, p: torch.Tensor, loaded: torch.Tensor, n_exp: int,
                     is_read: bool) -> list[Finding]:
    """Non-finite weights: one pass over the tensor; rows and counts only when it fails."""
    values = p.data
    if all_finite(values):
        return []
    bad = ~finite_mask(values) & loaded
    if not bad.any():
        return []
    return [Finding(name, role, "nonfinite", expert_rows(bad, n_exp), is_read, _nonfinite_detail(values, bad))]


def nonfinite(name: str, values: torch.Tensor) -> list[Finding]:
    """A tensor outside any judged layer (a norm, a bias, a buffer), read by every forward pass: its non-finite
    values, if any."""
    if all_finite(values):
        return []
    bad = ~finite_mask(values)
    return [Finding(name, tensor_role(name), "nonfinite", (), True, _nonfinite_detail(values, bad))]


def _scale_findings(name: str, role: str, p: torch.Tensor, loaded: torch.Tensor, n_exp: int, is_read: bool,
                    single_input_scale: bool) -> list[Finding]:
    values = p.data.float()
    out = []
    nonfinite = ~torch.isfinite(values)
    tests = {"nonfinite": nonfinite, "negative": values < 0}
    if role != "block_scale":  # an all-zero weight block may legitimately carry a zero block scale
        tests["zero"] = values == 0
    for kind, bad in tests.items():
        bad = bad & loaded
        if bad.any():
            detail = _nonfinite_detail(values, bad) if kind == "nonfinite" else ""
            out.append(Finding(name, role, kind, expert_rows(bad, n_exp), is_read, detail))
    if role == "input_scale" and is_read and single_input_scale and bool(loaded.all()):
        finite = values[torch.isfinite(values)]
        if finite.numel() and float(finite.min()) != float(finite.max()):
            out.append(Finding(name, role, "varies", (), is_read,
                               f"{float(finite.min()):.4g}..{float(finite.max()):.4g} across experts; the backend "
                               "takes one value per layer (vLLM uses the max)"))
    return out
