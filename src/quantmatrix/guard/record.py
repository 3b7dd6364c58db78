"""What vLLM's weight loaders really wrote: every MoE and linear parameter's loader is wrapped (adapter.loaders),
right after the model is built, so each call notes its shard and (for experts) its row. No sentinel fill, no second
load, no copy of the weights; the wrappers are removed once the model is judged.

A MoE call is also held to the reference split (measure.split): right after it, the rank's slot for that shard and
expert must hold the rank's part of the tensor it was given (tensor parallel: gate rows first, then up, down by
input columns), and a rank must not write an expert it does not hold (expert parallel). Only what the rule places
exactly is compared; a shape it cannot place is left alone, so a layout the rule does not know is never refused."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from quantmatrix.adapter import loaders, parallel
from quantmatrix.adapter.roles import fused_parts
from quantmatrix.checkpoints.producers import role_of
from quantmatrix.measure import split
from quantmatrix.measure.loaded import Finding


@dataclasses.dataclass
class Layer:
    """One MoE or linear layer of the model, and for each of its parameters the rows written per shard."""

    name: str
    module: torch.nn.Module
    kind: str  # moe | linear
    params: dict[str, torch.nn.Parameter]
    writes: dict[str, dict[Any, set[int | None]]]
    facts: parallel.RankFacts | None = None  # a MoE layer's rank (its shard and experts)
    misplaced: list[Finding] = dataclasses.field(default_factory=list)  # writes off the reference split


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
            if kind == "moe":
                try:
                    layer.facts = parallel.rank_facts(module)
                except Exception as e:  # noqa: BLE001 - never break a build; judge() reports it
                    self.errors.append(f"{layer.name}: {type(e).__name__}: {e}")
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
                    wrong = misplaced(layer, pname, args, kwargs) if layer.facts is not None else None
                except Exception as e:  # noqa: BLE001 - never break a load; judge() reports it
                    self.errors.append(f"{layer.name}.{pname}: {type(e).__name__}: {e}")
                else:
                    layer.writes[pname].setdefault(shard, set()).add(row)
                    if wrong is not None:
                        layer.misplaced.append(wrong)
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
    counts as loaded, and the values are still judged. A parameter with no elements holds nothing to load (vLLM
    registers zero-sized placeholders, e.g. a symmetric GPTQ's qzeros, only so their checkpoint names resolve)."""
    p = layer.params[pname]
    if direct or p.numel() == 0:
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


def misplaced(layer: Layer, pname: str, args: tuple, kwargs: dict) -> Finding | None:
    """A MoE weight_loader call that just wrote off the reference split: an expert this rank does not hold, or a
    slot that does not hold the rank's part of what it was given. None when it is right or the rule cannot say."""
    call = loaders.moe_call(args, kwargs)
    loaded, expert, facts = call["loaded_weight"], int(call["expert_id"]), layer.facts
    param = layer.params[pname]
    name = f"{layer.name}.{pname}"
    if (facts is None or loaded.dim() == 3 or param.dim() == 0 or fused_parts(name) is None
            or loaders.converts_on_load(layer.module)):
        return None
    rank = facts.ep_rank if facts.ep_size > 1 else facts.tp_rank
    whole = param.shape[0] == facts.global_experts != len(facts.experts)  # indexed by global expert on every rank
    row = expert if whole else loaders.local_row(layer.module, expert)
    if row < 0:
        return Finding(name, role_of(pname), "misplaced", (expert,), True,
                       f"rank {rank}'s weight loader wrote expert {expert}, which it does not hold", rank)
    where = split.place(call["shard_id"], tuple(loaded.shape), tuple(param.shape[1:]), facts.tp_rank, facts.tp_size,
                        role_of(pname))
    axis = split.split_axis(call["shard_id"], tuple(loaded.shape), role_of(pname))
    if isinstance(where, tuple) or (axis is not None and loaded.shape[axis] % facts.tp_size):
        return None  # shapes the rule does not place exactly: not judged here (rank_shards does, from the files)
    if split.same(where.held(param.data[row]), where.part(loaded)):
        return None
    return Finding(name, role_of(pname), "misplaced", (expert,), True,
                   f"rank {rank} slot {split.slices(where.dest)} must hold {call['shard_id']}'s part "
                   f"{split.slices(where.source)} of the tensor it was given; it holds other data", rank)
