"""The sanitize mode's parameter record, made inside every engine process at the poison plugin's seams
(adapter.engine.loader_seams), so that a sanitizer's device addresses can be named as layer, tensor and expert.
Entry point `vllm.general_plugins: quantmatrix_params = quantmatrix.engine.params:register`; the engine child also
registers it in every process vLLM spawns (an install made earlier may not list the entry point).

With QUANTMATRIX_RECORD_PARAMS=1 (set by the runner for a mode with a `sanitizer:` knob, never by a matrix's env)
every parameter and registered buffer of the model is recorded twice: right after the model is built (the tensors
the weight loaders write, and that process_weights_after_loading reads: the seed bug's alphas fold read its
never-written input_scale there) and right after process_weights_after_loading (what the kernels read at run
time). Each entry: name, parameter, buffer or tensor attribute of a module, data_ptr, the byte span it
covers, element size, shape, strides, dtype, device, and for a MoE layer's expert tensors the number of local
experts along dim 0.

On CUDA, right after the second record, the plugin reads a small tensor nobody wrote (the marker) and keeps it
allocated: initcheck reports that read, so in its report every read before the marker's may touch the tensors of
either record and every read after it only the second's (measure.uninit). Without it (the caching allocator can
hand the marker recycled, written memory) the order is unknown and both records apply throughout.

The record is plain data in `STATE`, read back from inside the engine (engine.inspect) with the run's result.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import torch

from quantmatrix.adapter import engine as adapter
from quantmatrix.adapter import loaders
from quantmatrix.engine.protocol import BUILT, PROCESSED, RECORD_ENV

MARKER_ELEMENTS = 4  # float32: four reads initcheck reports, at addresses no other tensor can take


@dataclasses.dataclass
class State:
    """What was recorded in this process: one entry per record (stage, model index, tensors, marker)."""

    registered_by: str | None = None
    requested: bool = False
    seam: str | None = None
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    markers: list[torch.Tensor] = dataclasses.field(default_factory=list)  # kept: their addresses stay unique

    def as_dict(self) -> dict[str, Any]:
        return {"registered_by": self.registered_by, "requested": self.requested, "seam": self.seam,
                "records": self.records, "pid": os.getpid()}


STATE = State()


def span(t: torch.Tensor) -> int:
    """Bytes from data_ptr to the end of the tensor's last element (a strided view included)."""
    if t.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return (last + 1) * t.element_size()


def entry(name: str, kind: str, t: torch.Tensor, experts: int | None) -> dict[str, Any]:
    return {"name": name, "kind": kind, "ptr": t.data_ptr(), "nbytes": span(t), "element_size": t.element_size(),
            "shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).removeprefix("torch."),
            "device": str(t.device), "experts": experts}


def _attributes(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Tensors a module keeps as plain attributes, neither parameter nor buffer (a kernel's repacked weights, a
    workspace): read by kernels all the same."""
    return [(f"{name}.{attr}" if name else attr, value) for name, module in model.named_modules()
            for attr, value in vars(module).items() if isinstance(value, torch.Tensor)]


def tensors(model: torch.nn.Module) -> list[dict[str, Any]]:
    """Every parameter, buffer and tensor attribute of a module with storage (tied ones under each name); an
    expert tensor of a MoE layer (dim 0 = its local experts) says how many experts it holds."""
    rows = {name: loaders.num_local_experts(m) for name, m in model.named_modules() if adapter.is_moe_layer(m)}
    out = []
    for kind, named in (("parameter", model.named_parameters(remove_duplicate=False)),
                        ("buffer", model.named_buffers(remove_duplicate=False)), ("attribute", _attributes(model))):
        for name, t in named:
            if t.device.type == "meta":
                continue
            n = rows.get(name.rpartition(".")[0])
            out.append(entry(name, kind, t, n if n and t.dim() and t.shape[0] == n else None))
    return out


def place_marker(model: torch.nn.Module) -> dict[str, int] | None:
    """Read a fresh, never-written CUDA tensor once and keep it allocated; None on a model without CUDA tensors."""
    device = next((p.device for p in model.parameters() if p.device.type == "cuda"), None)
    if device is None:
        return None
    marker = torch.empty(MARKER_ELEMENTS, dtype=torch.float32, device=device)
    marker.sum()
    torch.cuda.synchronize(device)
    STATE.markers.append(marker)
    return {"ptr": marker.data_ptr(), "nbytes": span(marker)}


def register(source: str = adapter.PLUGIN_GROUP) -> None:
    """Install the record at the loader seams in this process (idempotent); a no-op unless RECORD_ENV is 1."""
    if STATE.registered_by is not None:
        return
    STATE.registered_by = source
    STATE.requested = os.environ.get(RECORD_ENV, "").strip() == "1"
    if not STATE.requested:
        return
    module, build_name, post_load_name = adapter.loader_seams()
    build, post_load = getattr(module, build_name), getattr(module, post_load_name)
    STATE.seam = f"{module.__name__}.{build_name} / {post_load_name}"
    index: dict[int, int] = {}

    @functools.wraps(build)
    def build_recorded(*args: Any, **kwargs: Any) -> Any:
        model = build(*args, **kwargs)
        index[id(model)] = len(index)
        STATE.records.append({"stage": BUILT, "model": index[id(model)], "tensors": tensors(model), "marker": None})
        return model

    @functools.wraps(post_load)
    def process_recorded(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        result = post_load(model, *args, **kwargs)
        STATE.records.append({"stage": PROCESSED, "model": index.get(id(model)), "tensors": tensors(model),
                              "marker": place_marker(model)})
        return result

    setattr(module, build_name, build_recorded)
    setattr(module, post_load_name, process_recorded)
