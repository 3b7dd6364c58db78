"""Post-load audit: after vLLM's real weight loading, which MoE tensors the chosen kernel reads were never
written, and which loaded scales are unusable.

Every parameter is pre-filled with a sentinel, the checkpoint is loaded, and the fill and load are repeated with
a second sentinel: an element is unloaded only if it held the sentinel both times (one byte sentinel alone gives
false hits on packed uint8 / fp8 data, 1 in 256). Reusable on a live model: `held_sentinel` works on any module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch

from quantmatrix.vllm_adapter import MoELayer, role_of

# (float sentinel, byte sentinel) per pass
SENTINELS = ((float("nan"), 0xA5), (-7.25e4, 0x5A))
_SCALE_ROLES = ("block_scale", "global_scale", "input_scale")


@dataclasses.dataclass(frozen=True)
class Finding:
    param: str
    role: str
    kind: str  # unloaded | nonfinite | zero | negative | refused (the loader raised) | varies
    experts: tuple[int, ...]  # affected expert rows (empty: not an expert-indexed tensor)
    read: bool  # does the selected backend read this tensor?
    detail: str = ""

    def describe(self) -> str:
        where = f" [expert{'s' if len(self.experts) > 1 else ''} {_ranges(self.experts)}]" if self.experts else ""
        return f"{self.param}{where}: {self.kind}{' (' + self.detail + ')' if self.detail else ''}"


@dataclasses.dataclass(frozen=True)
class Report:
    backend: str
    reads: frozenset[str]
    findings: tuple[Finding, ...]
    loaded: frozenset[str]

    @property
    def read_but_unloaded(self) -> list[Finding]:
        return [f for f in self.findings if f.read and f.kind == "unloaded"]

    @property
    def unusable(self) -> list[Finding]:
        """Loaded with values no kernel can use, or refused by vLLM's loader (loud, but the checkpoint is broken)."""
        return [f for f in self.findings if f.read and f.kind in ("nonfinite", "zero", "negative", "refused")]

    @property
    def notes(self) -> list[Finding]:
        """Recorded, not failed: created-but-unread tensors (input_scale under Marlin), per-expert spreads."""
        return [f for f in self.findings if f not in self.read_but_unloaded and f not in self.unusable]


def _ranges(rows: Iterable[int]) -> str:
    rows = sorted(rows)
    out, start = [], None
    for i, r in enumerate(rows):
        if start is None:
            start = r
        if i + 1 == len(rows) or rows[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(out)


def fill(params: Mapping[str, torch.Tensor], pass_index: int) -> None:
    fsent, bsent = SENTINELS[pass_index]
    with torch.no_grad():
        for p in params.values():
            if p.dtype.is_floating_point and p.element_size() > 1:
                p.data.fill_(fsent)
            else:  # uint8 packed weights, fp8 block scales: fill the bytes
                p.data.view(torch.uint8).fill_(bsent)


def held_sentinel(p: torch.Tensor, pass_index: int) -> torch.Tensor:
    """Boolean mask of elements that still hold this pass's sentinel."""
    fsent, bsent = SENTINELS[pass_index]
    if p.dtype.is_floating_point and p.element_size() > 1:
        return torch.isnan(p.data) if fsent != fsent else p.data == fsent
    return p.data.view(torch.uint8) == bsent


def _expert_rows(mask: torch.Tensor, num_experts: int) -> tuple[int, ...]:
    if mask.dim() == 0 or mask.shape[0] != num_experts:
        return ()
    return tuple(int(i) for i in torch.nonzero(mask.reshape(num_experts, -1).any(dim=1)).flatten())


def audit(layers: Iterable[MoELayer], tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]],
          reads: frozenset[str], single_input_scale: bool) -> Report:
    """Audit every MoE layer of the checkpoint (a hole can sit in any layer) against one backend's reads."""
    reports = [_audit_one(layer, tensors, reads, single_input_scale) for layer in layers]
    return Report(reports[0].backend, reads, tuple(f for r in reports for f in r.findings),
                  frozenset(n for r in reports for n in r.loaded))


def _audit_one(layer: MoELayer, tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]],
               reads: frozenset[str], single_input_scale: bool) -> Report:
    """Load the checkpoint into `layer` twice (one sentinel each) and judge every parameter."""
    params = {layer.prefix + n: p for n, p in layer.parameters().items()}
    masks = []
    loaded: set[str] = set()
    refused: dict[str, str] = {}
    for pass_index in range(len(SENTINELS)):
        fill(params, pass_index)
        for name, tensor in tensors():  # one at a time, so a refusal names its tensor
            if not name.startswith(layer.prefix):
                continue
            try:
                loaded |= layer.load([(name, tensor)])
            except (RuntimeError, ValueError, AssertionError, IndexError) as e:
                refused[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        masks.append({n: held_sentinel(p, pass_index) for n, p in params.items()})
    findings = [Finding(name, role_of(name), "refused", (), True, why) for name, why in sorted(refused.items())]
    n_exp = layer.num_experts
    for name, p in params.items():
        role = role_of(name)
        is_read = role in reads
        unloaded = masks[0][name] & masks[1][name]
        if unloaded.any():
            rows = _expert_rows(unloaded, n_exp)
            share = f"{int(unloaded.sum())}/{unloaded.numel()} elements"
            findings.append(Finding(name, role, "unloaded", rows, is_read, share))
        if role in _SCALE_ROLES:
            findings += _scale_findings(name, role, p, ~unloaded, n_exp, is_read, single_input_scale)
    return Report(layer.backend, reads, tuple(findings), frozenset(loaded))


def _scale_findings(name: str, role: str, p: torch.Tensor, loaded: torch.Tensor, n_exp: int, is_read: bool,
                    single_input_scale: bool) -> list[Finding]:
    values = p.data.float()
    out = []
    tests = {"nonfinite": ~torch.isfinite(values), "negative": values < 0}
    if role != "block_scale":  # an all-zero weight block may legitimately carry a zero block scale
        tests["zero"] = values == 0
    for kind, bad in tests.items():
        bad = bad & loaded
        if bad.any():
            out.append(Finding(name, role, kind, _expert_rows(bad, n_exp), is_read))
    if role == "input_scale" and is_read and single_input_scale and bool(loaded.all()):
        finite = values[torch.isfinite(values)]
        if finite.numel() and float(finite.min()) != float(finite.max()):
            out.append(Finding(name, role, "varies", (), is_read,
                               f"{float(finite.min()):.4g}..{float(finite.max()):.4g} across experts; the backend "
                               "takes one value per layer (vLLM uses the max)"))
    return out


def verdict(report: Report, cell_words: str, weight_only_checkpoint: bool, expected: Iterable[str] = ()) -> str | None:
    """None when the audit found exactly what the matrix expects (usually nothing), else what breaks and why."""
    problems = report.read_but_unloaded + report.unusable
    found = {f.kind for f in problems}
    if found == set(expected):
        return None
    if not problems:
        return (f"{cell_words}: the matrix expects the audit to find {', '.join(sorted(expected))} in tensors "
                f"backend {report.backend} reads, but every read tensor was loaded and usable")
    names = "; ".join(f.describe() for f in problems)
    head = f"{cell_words}: backend {report.backend} reads tensors that"
    if report.read_but_unloaded and not report.unusable:
        head += " were never loaded from the checkpoint"
    elif not report.read_but_unloaded:
        head += " were loaded with unusable values"
    else:
        head += " were never loaded or hold unusable values"
    why = ""
    if any(f.role == "input_scale" for f in report.read_but_unloaded):
        why = (" - input_scale is folded into g1_alphas/g2_alphas, so every expert output is scaled by whatever "
               "memory held (0.0 on GB10 zeroed every expert)")
        if weight_only_checkpoint:
            why = " - weight-only checkpoint routed to a W4A4 fused-MoE backend: it has no input_scale" + why
    missing = set(expected) - found
    tail = f" [the matrix also expected: {', '.join(sorted(missing))}]" if missing else ""
    return f"{head}: {names}{why}{tail}"


def checkpoint_tensors(checkpoint_dir: Path, prefix: str = "") -> Callable[[], Iterable[tuple[str, torch.Tensor]]]:
    """A re-iterable source of the checkpoint's tensors under `prefix`, read from its safetensors files."""
    from safetensors import safe_open

    files = sorted(checkpoint_dir.glob("*.safetensors"))

    def tensors() -> Iterable[tuple[str, torch.Tensor]]:
        for path in files:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if name.startswith(prefix):
                        yield name, f.get_tensor(name)
    return tensors


_CUDA_ONLY = ("Torch not compiled with CUDA enabled", "torch.ops._C", "'_C' object has no attribute",
              "No CUDA GPUs are available", "Found no NVIDIA driver")


@dataclasses.dataclass(frozen=True)
class KernelFormat:
    """What vLLM's post-processing produced, or why it cannot run on this host."""

    needs_cuda: str | None
    alphas_finite: bool = True
    activation_scales_kept: bool = False


def kernel_format(layer: MoELayer, tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> KernelFormat:
    """Run process_weights_after_loading + the fused-MoE quant config on a freshly loaded layer."""
    layer.load(tensors())
    try:
        quant_config = layer.process_after_loading()
    except (AssertionError, AttributeError, RuntimeError) as e:
        text = f"{type(e).__name__}: {e}"
        if any(marker in text for marker in _CUDA_ONLY):
            return KernelFormat(needs_cuda=f"vLLM's kernel-format conversion for {layer.backend} needs CUDA on "
                                           f"this host ({text.splitlines()[0][:200]})")
        raise
    values = [getattr(quant_config, n, None) for n in ("g1_alphas", "g2_alphas")]
    finite = all(bool(torch.isfinite(v).all()) for v in values if isinstance(v, torch.Tensor))
    kept = any(isinstance(getattr(quant_config, n, None), torch.Tensor) for n in ("a1_gscale", "a2_gscale"))
    return KernelFormat(None, finite, kept)
