"""The post-load audit's measurement: fill every parameter of vLLM's MoE layers with a sentinel, load the
checkpoint through vLLM's real weight loaders, repeat with a second sentinel, and report every element that held
the sentinel both times (one byte sentinel alone gives false hits on packed uint8 / fp8 data, 1 in 256), plus
every loaded scale no kernel can use (measure.findings, shared with the production guard). checks.audit judges
the findings.

Imports torch: the plugin imports this module only when an audit case runs, never while collecting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch

from quantmatrix.adapter.layers import MoELayer
from quantmatrix.checkpoints.producers import role_of
from quantmatrix.measure import findings
from quantmatrix.measure.loaded import AuditReport, Finding

# (float sentinel, byte sentinel) per pass
SENTINELS = ((float("nan"), 0xA5), (-7.25e4, 0x5A))


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


def audit(layers: Iterable[MoELayer], tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]],
          reads: frozenset[str], single_input_scale: bool) -> AuditReport:
    """Audit every MoE layer of the checkpoint (a hole can sit in any layer) against one backend's reads."""
    reports = [_audit_one(layer, tensors, reads, single_input_scale) for layer in layers]
    return AuditReport(reports[0].backend, reads, tuple(f for r in reports for f in r.findings),
                  frozenset(n for r in reports for n in r.loaded))


def _audit_one(layer: MoELayer, tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]],
               reads: frozenset[str], single_input_scale: bool) -> AuditReport:
    """Load the checkpoint into `layer` twice (one sentinel each) and judge every parameter."""
    return load_twice(layer, tensors).measure(layer.backend, reads, single_input_scale)


@dataclasses.dataclass
class Loaded:
    """A layer after the two sentinel loads: its parameters (holding the second load), where both sentinels
    survived, and what vLLM's loader refused; measured against any backend's reads (the load does not depend on
    the backend, so every arch whose layer has the same parameters shares it)."""

    params: dict[str, torch.Tensor]
    unloaded: dict[str, torch.Tensor]
    refusals: list[Finding]
    num_experts: int

    def measure(self, backend: str, reads: frozenset[str], single_input_scale: bool) -> AuditReport:
        return findings.measure_layer(self.params, self.unloaded, backend, reads, single_input_scale,
                                      self.num_experts, self.refusals)


def load_twice(layer: MoELayer, tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> Loaded:
    """Fill, load the checkpoint's tensors one at a time (so a refusal names its tensor), twice."""
    params = {layer.prefix + n: p for n, p in layer.parameters().items()}
    masks = []
    refused: dict[str, str] = {}
    for pass_index in range(len(SENTINELS)):
        fill(params, pass_index)
        for name, tensor in tensors():
            if not name.startswith(layer.prefix):
                continue
            try:
                layer.load([(name, tensor)])
            except (RuntimeError, ValueError, AssertionError, IndexError) as e:
                refused[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        masks.append({n: held_sentinel(p, pass_index) for n, p in params.items()})
    refusals = [Finding(name, role_of(name), "refused", (), True, why) for name, why in sorted(refused.items())]
    return Loaded(params, {n: masks[0][n] & masks[1][n] for n in params}, refusals, layer.num_experts)


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
