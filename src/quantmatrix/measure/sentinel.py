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

# (float sentinel, byte sentinel) per pass. The float sentinels are both NaN, told apart by their bits: pass 0 the
# canonical quiet NaN, pass 1 a quiet NaN with a payload (per float width), which no conversion of a loaded value
# produces. Some of vLLM's loaders compare what a parameter already holds with the value they load (compressed-
# tensors' w1/w3 input scales: `param != 1 and |param - loaded| > 1e-5` raises); NaN compares false, so a sentinel
# never trips such a check, as the parameter's own initial value would not.
SENTINELS = ((float("nan"), 0xA5), (float("nan"), 0x5A))
# What vLLM's loaders refuse a tensor with (AttributeError: the layer has no parameter for it, e.g. an input_scale
# beside a dynamic FP8 method); a refusal is a finding naming the tensor.
REFUSALS = (RuntimeError, ValueError, AssertionError, IndexError, AttributeError)
_PAYLOAD_NAN = {torch.bfloat16: (torch.int16, 0x7FC5), torch.float16: (torch.int16, 0x7E5A),
                torch.float32: (torch.int32, 0x7FC5A5A5), torch.float64: (torch.int64, 0x7FF8A5A5A5A5A5A5)}


def fill(params: Mapping[str, torch.Tensor], pass_index: int, padding: Mapping[str, tuple[int, ...]] = {}) -> None:
    """The pass's sentinel in every element, but vLLM's padding (`padding`: per parameter, the corner of an expert
    row the loader fills), which keeps the zeros vLLM created it with: no checkpoint tensor is meant to reach it."""
    fsent, bsent = SENTINELS[pass_index]
    with torch.no_grad():
        for name, p in params.items():
            if p.dtype.is_floating_point and p.element_size() > 1:
                if pass_index == 0:
                    p.data.fill_(fsent)
                else:
                    view, bits = _PAYLOAD_NAN[p.dtype]
                    p.data.view(view).fill_(bits)
            else:  # uint8 packed weights, fp8 block scales: fill the bytes
                p.data.view(torch.uint8).fill_(bsent)
            if name in padding:
                outside = torch.ones(p.shape, dtype=torch.bool)
                outside[(slice(None), *(slice(0, c) for c in padding[name]))] = False
                p.data[outside] = 0


def held_sentinel(p: torch.Tensor, pass_index: int) -> torch.Tensor:
    """Boolean mask of elements that still hold this pass's sentinel (pass 1: exactly its NaN's bits)."""
    _, bsent = SENTINELS[pass_index]
    if p.dtype.is_floating_point and p.element_size() > 1:
        if pass_index == 0:
            return torch.isnan(p.data)
        view, bits = _PAYLOAD_NAN[p.dtype]
        return p.data.view(view) == bits
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
    global_experts: int = 0  # under a parallel layout: the model's count, by which some parameters are indexed

    def measure(self, backend: str, reads: frozenset[str], single_input_scale: bool) -> AuditReport:
        return findings.measure_layer(self.params, self.unloaded, backend, reads, single_input_scale,
                                      self.num_experts, self.refusals, self.global_experts)


def load_twice(layer: MoELayer, tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> Loaded:
    """Fill, load the checkpoint's tensors one at a time (so a refusal names its tensor), twice."""
    params = {layer.prefix + n: p for n, p in layer.parameters().items()}
    padding = layer.padding()
    masks = []
    refused: dict[str, str] = {}
    for pass_index in range(len(SENTINELS)):
        fill(params, pass_index, padding)
        for name, tensor in tensors():
            if not name.startswith(layer.prefix):
                continue
            try:
                layer.load([(name, tensor)])
            except REFUSALS as e:
                refused[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        masks.append({n: held_sentinel(p, pass_index) for n, p in params.items()})
    refusals = [Finding(name, role_of(name), "refused", (), True, why) for name, why in sorted(refused.items())]
    return Loaded(params, {n: masks[0][n] & masks[1][n] for n in params}, refusals, layer.num_experts)


def load_accepted(layer: MoELayer, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load the tensors vLLM's loaders accept, one at a time, passing over each one they refuse (the audit names
    those): what a conversion measured after loading needs."""
    for name, tensor in tensors:
        try:
            layer.load([(name, tensor)])
        except REFUSALS:
            continue


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
