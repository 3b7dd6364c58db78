"""Hand-made vLLM sharding bugs, for proving that the cpu tier catches each one by rank, tensor and slice.

Each bug changes vLLM's RoutedExperts (fused_moe/routed_experts.py) the way a real regression would, in a child
process only: `install(tmp, {checkpoint: bug})` writes a `sitecustomize.py` that patches the module as soon as vLLM
imports it, in every process that has the directory on PYTHONPATH (the child pytest, its rank processes, a real
engine's workers). Each bug acts only while vLLM loads the checkpoint it is given for, so one child run can carry
all three, each on its own checkpoint, beside checkpoints loaded by the unchanged code.

- block_scale_input_dim: the w13 block scale (`weight_scale`, one fp8 value per 16 inputs) sharded along the input
  dimension instead of the output dimension (silent at tensor parallel 2, where the shapes still fit).
- gate_up_swapped_odd_ranks: on odd tensor-parallel ranks the gate rows land in the up half of w13 and back.
- input_scale_every_rank: a per-expert input scale is loaded on every rank under expert parallelism, not only on its
  owner: vLLM's "not on this rank" test skipped for input scales, so a non-owner writes row -1 (its last expert).
"""

from __future__ import annotations

import inspect
import json
import os
import textwrap
from pathlib import Path
from typing import Any

import vllm_patch

MODULE = "vllm.model_executor.layers.fused_moe.routed_experts"
BUGS = ("block_scale_input_dim", "gate_up_swapped_odd_ranks", "input_scale_every_rank")
ENV = "QM_TEST_SHARD_BUGS"  # {checkpoint directory: bug}, JSON

def install(tmp: Path, bugs: dict[Path, str]) -> dict[str, str]:
    """The environment under which every Python process carries the bugs, each for its checkpoint."""
    assert set(bugs.values()) <= set(BUGS), bugs
    return {"PYTHONPATH": vllm_patch.install(tmp, {MODULE: "shard_bugs.apply"}),
            ENV: json.dumps({str(Path(c).resolve()): bug for c, bug in bugs.items()})}


def _now() -> str | None:
    """The bug of the checkpoint vLLM is loading now, None for any other."""
    checkpoint = vllm_patch.checkpoint_now()
    return json.loads(os.environ.get(ENV, "{}")).get(checkpoint) if checkpoint else None


def apply(module: Any) -> None:
    cls = module.RoutedExperts
    _input_scale_every_rank(cls)  # first: it edits the source of vLLM's own weight_loader, which the next wraps
    _block_scale_input_dim(cls)
    _gate_up_swapped(cls)


def _block_scale_input_dim(cls: Any) -> None:
    loader, load_w13 = cls.weight_loader, cls._load_w13

    def weight_loader(self, *args, **kwargs):
        name = kwargs.get("weight_name", args[2] if len(args) > 2 else "")
        self._block_scale_call = name.endswith("w13_weight_scale") and _now() == "block_scale_input_dim"
        try:
            return loader(self, *args, **kwargs)
        finally:
            self._block_scale_call = False

    def _load_w13(self, expert_data, shard_dim, shard_id, loaded_weight, tp_rank, load_full=False):
        if getattr(self, "_block_scale_call", False) and loaded_weight.dim() == 2:
            shard_dim = 1 - shard_dim  # the bug: the input dimension
        return load_w13(self, expert_data, shard_dim, shard_id, loaded_weight, tp_rank, load_full)

    cls.weight_loader, cls._load_w13 = weight_loader, _load_w13


def _gate_up_swapped(cls: Any) -> None:
    load_w13 = cls._load_w13

    def _load_w13(self, expert_data, shard_dim, shard_id, loaded_weight, tp_rank, load_full=False):
        if tp_rank % 2 and _now() == "gate_up_swapped_odd_ranks":
            shard_id = {"w1": "w3", "w3": "w1"}[shard_id]  # the bug
        return load_w13(self, expert_data, shard_dim, shard_id, loaded_weight, tp_rank, load_full)

    cls._load_w13 = _load_w13


def _input_scale_every_rank(cls: Any) -> None:
    """A source edit of RoutedExperts.weight_loader, compiled in the module's namespace."""
    source = textwrap.dedent(inspect.getsource(cls.weight_loader))
    guard = "if expert_id == -1 and not use_global_sf:"
    assert source.count(guard) == 1, "vLLM's weight_loader moved: update tests/shard_bugs.py"
    source = source.replace(guard, "if expert_id == -1 and not use_global_sf and not (\"input_scale\" in weight_name "
                                   "and _shard_bug_now() == \"input_scale_every_rank\"):")
    module = vars(inspect.getmodule(cls))
    module["_shard_bug_now"] = _now
    namespace: dict[str, Any] = {}
    exec(compile(source, inspect.getsourcefile(cls.weight_loader) or MODULE, "exec"), module, namespace)  # noqa: S102
    cls.weight_loader = namespace["weight_loader"]
