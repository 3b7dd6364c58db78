"""Which tensor roles a MoE kernel really reads, observed rather than declared: load the layer, poison every
tensor of one role (NaN for floating point, every bit flipped for packed integers, which have no NaN), convert and
run the layer, and see whether its output changed. One fresh, freshly loaded layer per role, so a role read only
while converting (the seed bug folded `input_scale` into `g1_alphas` there) counts as read.

The measurement is generic over three callables (a fresh loaded layer, its tensors by role, a forward), so that
quantmatrix's tests can drive it with a fake layer on CPU; `measure` binds them to vLLM's real layer on a GPU."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where measured: collecting the suites imports no torch
    import torch


@dataclasses.dataclass(frozen=True)
class Observation:
    """`changed[role]`: poisoning that role changed the layer's output (None: the role has no tensor in this
    layer). `tensors[role]`: the parameter names poisoned. `error`: why nothing could be measured."""

    backend: str | None = None
    changed: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    tensors: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    error: str | None = None

    @property
    def read(self) -> frozenset[str]:
        return frozenset(role for role, changed in self.changed.items() if changed)


def poison(t: torch.Tensor) -> None:
    """Make every element unusable in place: NaN where the dtype has one, all bits flipped where it has none."""
    import torch

    if t.dtype.is_floating_point:
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.logical_not_()
    else:
        t.bitwise_not_()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-equal outputs (NaN in either side is a change: the clean output has none)."""
    import torch

    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


def observe(fresh: Callable[[], Any], roles: Callable[[Any], Mapping[str, Sequence[tuple[str, torch.Tensor]]]],
            forward: Callable[[Any], torch.Tensor]) -> Observation:
    """Poison one role at a time in a fresh loaded layer and compare its output with a clean run's."""
    import torch

    clean = forward(fresh())
    if not bool(torch.isfinite(clean).all()):
        return Observation(error="the clean layer's output is not finite, so a poisoned role cannot show")
    if not _same(forward(fresh()), clean):
        return Observation(error="two clean runs of the layer differ, so a change cannot be blamed on a role")
    changed: dict[str, bool] = {}
    names: dict[str, tuple[str, ...]] = {}
    for role in sorted(roles(fresh())):
        layer = fresh()
        tensors = roles(layer)[role]
        with torch.no_grad():
            for _, t in tensors:
                poison(t)
        names[role] = tuple(name for name, _ in tensors)
        changed[role] = not _same(forward(layer), clean)
    return Observation(changed=changed, tensors=names)


def measure(checkpoint_dir: Path, capability: tuple[int, int], tokens: int = 8, seed: int = 0) -> Observation:
    """The observation for vLLM's real MoE layer of a checkpoint on this host's GPU (the gpu tier)."""
    import torch
    from safetensors.torch import load_file

    from quantmatrix.adapter import kernel, layers
    from quantmatrix.checkpoints.producers import role_of

    files = sorted(checkpoint_dir.glob("*.safetensors"))
    weights = {name: t for path in files for name, t in load_file(str(path)).items()}
    first = layers.build(checkpoint_dir, capability)
    if first.layer is None:
        return Observation(error=f"vLLM refused to build the MoE layer: {first.error}")
    backend = first.layer.backend
    hidden_size = first.layer.hidden_size
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    hidden = torch.randn(tokens, hidden_size, generator=torch.Generator().manual_seed(seed)).to(
        device=device, dtype=torch.bfloat16)

    def fresh() -> layers.MoELayer:
        layer = layers.build(checkpoint_dir, capability).layer
        assert layer is not None, "the layer built once and not again"  # same checkpoint, same capability
        layer.block.to(device)
        layer.load((name, t.to(device)) for name, t in weights.items())
        return layer

    def by_role(layer: layers.MoELayer) -> dict[str, list[tuple[str, torch.Tensor]]]:
        out: dict[str, list[tuple[str, torch.Tensor]]] = {}
        for name, param in layer.experts.named_parameters():
            role = role_of(name)
            if role != "other":
                out.setdefault(role, []).append((name, param.data))
        return out

    def forward(layer: layers.MoELayer) -> torch.Tensor:
        with torch.no_grad():
            return kernel.forward(layer, hidden).float().cpu()

    return dataclasses.replace(observe(fresh, by_role, forward), backend=backend)
