"""vLLM's weight-loading seams as the production guard (quantmatrix.guard) sees them: which modules are MoE and
linear layers, how a parameter's `weight_loader` is called (which shard, which expert), which shards a parameter
needs, the backend a layer selected, and the setting that routes MoE elsewhere. Every name
here is vLLM 0.32's; when one moves, these functions raise AdapterMismatch instead of guessing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantmatrix import bounded
from quantmatrix.adapter import engine, families
from quantmatrix.errors import AdapterMismatch

# What moves a weight-only NVFP4 MoE layer onto a backend that never reads input_scale.
ROUTE_WEIGHT_ONLY = "`--moe-backend marlin` (vllm serve) or `LLM(..., moe_backend=\"marlin\")`"
ALL_ROWS = -1  # a loader call that wrote every expert row at once (a 3-D loaded tensor)


def is_linear_layer(module: Any) -> bool:
    from vllm.model_executor.layers.linear import LinearBase

    return isinstance(module, LinearBase)


def layer_kind(module: Any) -> str | None:
    """"moe", "linear" or None (not judged)."""
    if engine.is_moe_layer(module):
        return "moe"
    return "linear" if is_linear_layer(module) else None


def default_weight_loader() -> Callable[..., Any]:
    """What vLLM's model loaders call for a parameter that carries no weight_loader of its own."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader as loader

    return loader


def wrap_weight_loader(param: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[[], None]:
    """Make vLLM's loaders call `wrap(loader)` for `param`, where loader is the parameter's own weight_loader or,
    when it has none, vLLM's default one. Returns the undo, which gives the parameter back exactly what it had."""
    own = getattr(param, "weight_loader", None)
    param.weight_loader = wrap(own if own is not None else default_weight_loader())

    def undo() -> None:
        if own is None:
            del param.weight_loader
        else:
            param.weight_loader = own

    return undo


# MoE methods whose weight_loader stores a converted tensor, not the one it was given: MoeWNA16Method (GPTQ and AWQ
# where Marlin does not fit) transposes GPTQ/AWQ qweight, qzeros and scales and repacks them as uint8. A write of
# theirs cannot be held to the reference split of the checkpoint tensor.
_CONVERTING_LOADERS = ("MoeWNA16Method",)


def converts_on_load(module: Any) -> bool:
    """Whether the MoE layer's loader stores its tensors converted (_CONVERTING_LOADERS)."""
    qm = getattr(module, "quant_method", None)
    return type(getattr(qm, "old_quant_method", None) or qm).__name__ in _CONVERTING_LOADERS


def method_and_backend(module: Any) -> tuple[str, str, bool]:
    """(quant method class, backend name, weight-only) of a MoE or linear layer. The backend is the read-set name
    adapter.families gives a MoE method it knows (FP8_*, WNA16_*), else the method's backend enum, or a linear
    method's kernel class; weight-only is the method's own view (MoE `use_a16`, a WNA16 method, a ModelOpt linear
    method without an activation key, `akey`)."""
    qm = getattr(module, "quant_method", None)
    if qm is None:
        raise AdapterMismatch(f"{type(module).__name__} has no quant_method: update quantmatrix/adapter/loaders.py")
    source = getattr(qm, "old_quant_method", None) or qm
    if type(source).__name__ in families.READERS and engine.is_moe_layer(module):
        reading = families.read(source, lambda method: bool(getattr(method, "use_a16", False)))
        if reading.backend != "none":
            return type(source).__name__, reading.backend, reading.weight_only
    _, backend = engine.backend_of(source)
    kernel = getattr(source, "kernel", None)
    if backend is None and kernel is not None:
        backend = type(kernel).__name__
    if hasattr(source, "use_a16"):
        weight_only = bool(source.use_a16)
    else:
        weight_only = hasattr(source, "akey") and source.akey is None
    return type(source).__name__, backend or type(source).__name__, weight_only


def num_local_experts(module: Any) -> int:
    n = getattr(module, "local_num_experts", None)
    if not isinstance(n, int):
        raise AdapterMismatch(f"{type(module).__name__} has no local_num_experts: update "
                              "quantmatrix/adapter/loaders.py")
    return n


def moe_call(args: tuple, kwargs: dict) -> dict[str, Any]:
    """A MoE weight_loader call's arguments by name: weight_loader(param, loaded_weight, weight_name, shard_id,
    expert_id (global), return_success)."""
    names = ("param", "loaded_weight", "weight_name", "shard_id", "expert_id")
    bound = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in names}
    if "shard_id" not in bound or "expert_id" not in bound:
        raise AdapterMismatch("RoutedExperts.weight_loader was called without shard_id/expert_id: update "
                              "quantmatrix/adapter/loaders.py")
    return bound


def local_row(module: Any, expert: int) -> int:
    """The row of a MoE layer's parameters that holds global expert `expert`; -1 where this rank holds none."""
    return int(module._map_global_expert_id_to_local_expert_id(expert))


def loader_call(module: Any, kind: str, args: tuple, kwargs: dict) -> tuple[Any, int | None]:
    """(shard, local expert row) a weight_loader call writes. MoE: see moe_call; linear: weight_loader(param,
    loaded_weight, loaded_shard_id=None)."""
    if kind == "moe":
        bound = moe_call(args, kwargs)
        if getattr(bound["loaded_weight"], "dim", lambda: 0)() == 3:
            return bound["shard_id"], ALL_ROWS
        return bound["shard_id"], local_row(module, bound["expert_id"])
    shard = args[2] if len(args) > 2 else kwargs.get("loaded_shard_id")
    return shard, None


def expected_shards(module: Any, kind: str, param_name: str) -> frozenset[Any]:
    """The shards a fully loaded parameter received; a call with shard None writes the whole parameter."""
    if kind == "moe":
        return frozenset(("w1", "w3")) if param_name.startswith("w13") else frozenset(("w2",))
    cls = {c.__name__ for c in type(module).__mro__}
    if "QKVParallelLinear" in cls:
        return frozenset(("q", "k", "v"))
    if "MergedColumnParallelLinear" in cls:
        return frozenset(range(len(module.output_sizes)))
    return frozenset((None,))


def model_files(model_config: Any, prefix: str) -> list[str]:
    """The checkpoint files that hold tensors under `prefix` (the index's weight_map, else every safetensors
    file of a local checkpoint); [] when the checkpoint is not a local directory."""
    root = Path(str(getattr(model_config, "model", "")))
    if not root.is_dir():
        return []
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(bounded.read_bytes(index, "index")).get("weight_map", {})
            return sorted({str(root / f) for n, f in weight_map.items() if n.startswith(prefix)})
        except (bounded.InputError, ValueError, RecursionError, AttributeError, TypeError) as e:
            return [f"({index} unreadable: {bounded.shown(e, 200)})"]
    return sorted(str(p) for p in root.glob("*.safetensors"))
