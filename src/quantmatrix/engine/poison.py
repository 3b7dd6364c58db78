"""A vLLM general plugin that makes unwritten memory read as a chosen value (0, 1 or NaN) on any machine.

The seed bug read an uninitialised `input_scale`: 0.0 on GB10, 1.0 on RTX PRO 6000. With `QUANTMATRIX_POISON`
set (by a matrix mode), every tensor allocated with `torch.empty*` while vLLM builds the model is filled with the
value, and right before weights are loaded every parameter is filled too. What the constructor computes itself
(rotary caches, attention scales) keeps its value: it is initialised memory, not the bug class we hunt. Right
after the weights are loaded, and before `process_weights_after_loading` can fold anything, the plugin records
which MoE parameters still hold the value: the raw material of the post-load audit.

Entry point: `vllm.general_plugins: quantmatrix_poison = quantmatrix.engine.poison:register` (vLLM calls it in every
process). `register` is idempotent; the engine child also calls it, so checkouts whose installed metadata
predates the entry point are poisoned too. What happened is kept in `STATE`, per process, and read back from
inside the engine (engine.inspect).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from quantmatrix.adapter import engine as adapter
from quantmatrix.checkpoints.producers import role_of
from quantmatrix.engine.protocol import POISON_ENV as ENV

VALUES: dict[str, float] = {"zero": 0.0, "one": 1.0, "nan": math.nan}
_EMPTY = {torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty,
          torch.Tensor.new_empty_strided}


@dataclasses.dataclass
class State:
    """What the plugin did in this process; `requested` is the env value it saw, `seam` where it hooked."""

    registered_by: str | None = None
    requested: str | None = None
    seam: str | None = None
    models_built: int = 0
    allocations_filled: int = 0
    parameters_filled: int = 0
    buffers_filled: int = 0
    # MoE layer -> parameter -> what still held the poison after load_weights
    after_load: dict[str, dict[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    other_after_load: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "pid": os.getpid(), "active": self.models_built > 0}


STATE = State()


def requested() -> str | None:
    """The poison value asked for by the environment; an unknown one is an error, not a silent no-op."""
    name = os.environ.get(ENV, "").strip().lower()
    if not name:
        return None
    if name not in VALUES:
        raise ValueError(f"{ENV}={name!r}: expected one of {', '.join(VALUES)}")
    return name


def fill_value(dtype: torch.dtype, name: str) -> float | int:
    """The value written into a tensor of `dtype`. Integer storage (packed FP4, indices) has no NaN: it gets
    all bits set (0xFF in a packed FP4 byte is -6, -6), which is loud, and never a valid index."""
    value = VALUES[name]
    if dtype.is_floating_point:
        return value
    if dtype == torch.bool:
        return True if math.isnan(value) else bool(value)
    if math.isnan(value):
        return -1 if dtype.is_signed else torch.iinfo(dtype).max
    return int(value)


def fill(t: torch.Tensor, name: str) -> bool:
    """Fill `t` in place; meta tensors (no storage yet) and complex ones are left alone."""
    if t.device.type == "meta" or t.is_complex() or t.numel() == 0:
        return False
    with torch.no_grad():
        t.fill_(fill_value(t.dtype, name))
    return True


def holds(t: torch.Tensor, name: str) -> torch.Tensor:
    """Element-wise: does `t` still hold the poison value?"""
    value = fill_value(t.dtype, name)
    if t.dtype.is_floating_point:
        t = t.float()
        return torch.isnan(t) if isinstance(value, float) and math.isnan(value) else t == value
    return t == value


class _PoisonEmpty(TorchFunctionMode):
    """Fill whatever `torch.empty*` hands out while the model is being built."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.filled = 0

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in _EMPTY and isinstance(out, torch.Tensor) and fill(out, self.name):
            self.filled += 1
        return out


@contextmanager
def poisoned_allocations(name: str) -> Iterator[_PoisonEmpty]:
    mode = _PoisonEmpty(name)
    with mode:
        yield mode


def poison_module(model: torch.nn.Module, name: str) -> tuple[int, int]:
    """Every parameter gets the value; buffers still holding it (nobody computed them) are counted.
    Returns (parameters filled, buffers holding the value)."""
    params = sum(fill(p, name) for p in model.parameters())
    buffers = sum(1 for b in model.buffers() if b.numel() and bool(holds(b, name).all()))
    return params, buffers


def still_poisoned(t: torch.Tensor, name: str) -> dict[str, Any] | None:
    """How much of `t` still holds the value: element count and the dim-0 rows (experts) that hold it entirely.
    A byte sentinel also matches real packed data by chance (1 in 256), so counts are facts, not verdicts."""
    if t.device.type == "meta" or t.numel() == 0:
        return None
    hit = holds(t.detach(), name)
    count = int(hit.sum())
    if count == 0:
        return None
    rows = [i for i, r in enumerate(hit.reshape(hit.shape[0], -1).all(dim=1).tolist()) if r] if hit.dim() else []
    return {"elements": count, "numel": t.numel(), "shape": list(t.shape), "dtype": str(t.dtype).removeprefix(
        "torch."), "full": count == t.numel(), "rows": rows}


def audit_after_load(model: torch.nn.Module, name: str, is_moe: Callable[[torch.nn.Module], bool],
                     role_of: Callable[[str], str]) -> None:
    """Record, per MoE layer, every parameter that still holds the value, with the role a kernel reads it in
    (weight, block_scale, global_scale, input_scale: what the audit matches against a backend's reads);
    elsewhere, the fully poisoned ones."""
    moe_params: set[int] = set()
    for layer_name, module in model.named_modules():
        if not is_moe(module):
            continue
        found = {}
        for pname, p in module.named_parameters(recurse=False):
            moe_params.add(id(p))
            hit = still_poisoned(p, name)
            if hit is not None:
                found[pname] = {**hit, "role": role_of(pname)}
        STATE.after_load[layer_name] = found
    for pname, p in model.named_parameters():
        if id(p) not in moe_params:
            hit = still_poisoned(p, name)
            if hit is not None and hit["full"]:
                STATE.other_after_load.append(pname)


def register(source: str = adapter.PLUGIN_GROUP) -> None:
    """Install the poison seams in this process (idempotent). vLLM calls it with no argument."""
    if STATE.registered_by is not None:
        return
    module, build_name, post_load_name = adapter.loader_seams()
    build, post_load = getattr(module, build_name), getattr(module, post_load_name)
    STATE.registered_by = source
    STATE.requested = requested()
    STATE.seam = f"{module.__name__}.{build_name} / {post_load_name}"
    if STATE.requested is None:
        return

    @functools.wraps(build)
    def build_poisoned(*args: Any, **kwargs: Any) -> Any:
        with poisoned_allocations(STATE.requested) as mode:
            model = build(*args, **kwargs)
        params, buffers = poison_module(model, STATE.requested)
        STATE.models_built += 1
        STATE.allocations_filled += mode.filled
        STATE.parameters_filled += params
        STATE.buffers_filled += buffers
        return model

    @functools.wraps(post_load)
    def audit_then_process(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        audit_after_load(model, STATE.requested, adapter.is_moe_layer, role_of)
        return post_load(model, *args, **kwargs)

    setattr(module, build_name, build_poisoned)
    setattr(module, post_load_name, audit_then_process)
