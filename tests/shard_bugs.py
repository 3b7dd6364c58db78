"""Hand-made vLLM sharding bugs, for proving that the cpu tier catches each one by rank, tensor and slice.

Each bug changes vLLM's RoutedExperts (fused_moe/routed_experts.py) the way a real regression would, in a child
process only: `install(tmp, bug)` writes a `sitecustomize.py` that patches the module as soon as vLLM imports it, in
every process that has the directory on PYTHONPATH (the child pytest, its rank processes, a real engine's workers).

- block_scale_input_dim: the w13 block scale (`weight_scale`, one fp8 value per 16 inputs) sharded along the input
  dimension instead of the output dimension (silent at tensor parallel 2, where the shapes still fit).
- gate_up_swapped_odd_ranks: on odd tensor-parallel ranks the gate rows land in the up half of w13 and back.
- input_scale_every_rank: a per-expert input scale is loaded on every rank under expert parallelism, not only on its
  owner: vLLM's "not on this rank" test skipped for input scales, so a non-owner writes row -1 (its last expert).
"""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path
from typing import Any

MODULE = "vllm.model_executor.layers.fused_moe.routed_experts"
BUGS = ("block_scale_input_dim", "gate_up_swapped_odd_ranks", "input_scale_every_rank")

_SITECUSTOMIZE = '''
import importlib.abc
import sys


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patch {module} right after it executes (the test's hand-made vLLM change: {bug})."""

    def find_spec(self, name, path, target=None):
        if name != {module!r}:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            import shard_bugs

            shard_bugs.apply({bug!r}, module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchOnImport())
'''


def install(tmp: Path, bug: str) -> Path:
    """A directory whose sitecustomize.py installs `bug` in any Python process started with it on PYTHONPATH
    (before this tests/ directory, which holds this module)."""
    assert bug in BUGS, bug
    where = tmp / f"sitecustomize-{bug}"
    where.mkdir(exist_ok=True)
    (where / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(module=MODULE, bug=bug), encoding="utf-8")
    return where


def apply(bug: str, module: Any) -> None:
    {"block_scale_input_dim": _block_scale_input_dim, "gate_up_swapped_odd_ranks": _gate_up_swapped,
     "input_scale_every_rank": _input_scale_every_rank}[bug](module.RoutedExperts)


def _block_scale_input_dim(cls: Any) -> None:
    loader, load_w13 = cls.weight_loader, cls._load_w13

    def weight_loader(self, *args, **kwargs):
        name = kwargs.get("weight_name", args[2] if len(args) > 2 else "")
        self._block_scale_call = name.endswith("w13_weight_scale")
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
        if tp_rank % 2:
            shard_id = {"w1": "w3", "w3": "w1"}[shard_id]  # the bug
        return load_w13(self, expert_data, shard_dim, shard_id, loaded_weight, tp_rank, load_full)

    cls._load_w13 = _load_w13


def _input_scale_every_rank(cls: Any) -> None:
    """A source edit of RoutedExperts.weight_loader, compiled in the module's namespace."""
    source = textwrap.dedent(inspect.getsource(cls.weight_loader))
    guard = "if expert_id == -1 and not use_global_sf:"
    assert source.count(guard) == 1, "vLLM's weight_loader moved: update tests/shard_bugs.py"
    source = source.replace(guard, 'if expert_id == -1 and not use_global_sf and "input_scale" not in weight_name:')
    namespace: dict[str, Any] = {}
    exec(compile(source, inspect.getsourcefile(cls.weight_loader) or MODULE, "exec"),  # noqa: S102
         vars(inspect.getmodule(cls)), namespace)
    cls.weight_loader = namespace["weight_loader"]
