"""What vLLM's weight loaders really wrote: every MoE and linear parameter's loader is wrapped (adapter.loaders),
right after the model is built, so each call notes its shard and (for experts) its row. No sentinel fill, no second
load, no copy of the weights; the wrappers are removed once the model is judged."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from quantmatrix.adapter import loaders


@dataclasses.dataclass
class Layer:
    """One MoE or linear layer of the model, and for each of its parameters the rows written per shard."""

    name: str
    module: torch.nn.Module
    kind: str  # moe | linear
    params: dict[str, torch.nn.Parameter]
    writes: dict[str, dict[Any, set[int | None]]]


class Recorder:
    """Installs the recording weight_loaders on a model (or one block of it) and keeps what they saw."""

    def __init__(self) -> None:
        self.layers: list[Layer] = []
        self.errors: list[str] = []  # calls it could not read: the judge then fails loudly, loading never does
        self.roots: list[tuple[str, torch.nn.Module]] = []  # what install() was given: every tensor is judged
        self.calls = 0  # weight_loader calls seen: none at all means the load format wrote param.data directly
        self._undo: list[Callable[[], None]] = []

    def install(self, model: torch.nn.Module, prefix: str = "") -> int:
        """Wrap every MoE and linear parameter's loader under `model`; returns how many were wrapped."""
        self.roots.append((prefix, model))
        for name, module in model.named_modules():
            kind = loaders.layer_kind(module)
            if kind is None:
                continue
            layer = Layer(prefix + name, module, kind, dict(module.named_parameters(recurse=False)), {})
            for pname, p in layer.params.items():
                layer.writes[pname] = {}
                self._undo.append(loaders.wrap_weight_loader(
                    p, functools.partial(self._recording, layer=layer, pname=pname)))
            self.layers.append(layer)
        return len(self._undo)

    def _recording(self, original: Callable[..., Any], layer: Layer, pname: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def recording(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            self.calls += 1
            if result is not False:  # MoE loaders answer False for an expert that is not on this rank
                try:
                    shard, row = loaders.loader_call(layer.module, layer.kind, args, kwargs)
                except Exception as e:  # noqa: BLE001 - never break a load; judge() reports it
                    self.errors.append(f"{layer.name}.{pname}: {type(e).__name__}: {e}")
                else:
                    layer.writes[pname].setdefault(shard, set()).add(row)
            return result
        return recording

    def uninstall(self) -> None:
        """Give every parameter its own loader back (a later reload must not record into this one)."""
        for undo in self._undo:
            undo()
        self._undo.clear()


def unloaded_mask(layer: Layer, pname: str, direct: bool = False) -> torch.Tensor:
    """Where the parameter was never written: one entry per expert row ([E, 1, ...]) for MoE tensors, else a
    scalar (a linear parameter missing any of its shards counts as not written). `direct`: the load format wrote
    param.data itself (sharded_state) and no weight_loader ran, so nothing here says what was not written: all
    counts as loaded, and the values are still judged."""
    p = layer.params[pname]
    if direct:
        return torch.tensor(False)
    writes = layer.writes[pname]
    need = loaders.expected_shards(layer.module, layer.kind, pname)
    if layer.kind == "moe" and p.dim() > 0 and p.shape[0] == loaders.num_local_experts(layer.module):
        rows = p.shape[0]
        done = torch.ones(rows, dtype=torch.bool)
        for shard in need:
            got = writes.get(shard, set())
            shard_done = torch.zeros(rows, dtype=torch.bool)
            if loaders.ALL_ROWS in got:
                shard_done[:] = True
            else:
                shard_done[[r for r in got if r is not None and 0 <= r < rows]] = True
            done &= shard_done
        return (~done).reshape(rows, *([1] * (p.dim() - 1)))
    written = None in writes or (need <= set(writes)) or (layer.kind == "moe" and bool(writes))
    return torch.tensor(not written)
