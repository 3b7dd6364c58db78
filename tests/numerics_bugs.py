"""Hand-made vLLM loading faults that leave every tensor loaded and finite, for proving that layer_numerics sees
what the read-sets and the audit cannot: each wraps RoutedExperts.weight_loader (the method every MoE parameter's
`weight_loader` is bound to when the layer is built), so a layer built afterwards loads through the fault."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

_GATE_UP = {"w1": "w3", "w3": "w1"}


def _wrap(monkeypatch: pytest.MonkeyPatch, change: Callable[[Any, str, str, int], tuple[str, int]]) -> None:
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    original = RoutedExperts.weight_loader

    def faulty(self: Any, param: Any, loaded_weight: Any, weight_name: str, shard_id: str, expert_id: int,
               *args: Any, **kwargs: Any) -> Any:
        shard_id, expert_id = change(self, weight_name, shard_id, expert_id)
        return original(self, param, loaded_weight, weight_name, shard_id, expert_id, *args, **kwargs)

    faulty.supports_moe_loading = True  # type: ignore[attr-defined]
    monkeypatch.setattr(RoutedExperts, "weight_loader", faulty)


def swap_gate_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every expert's gate (w1) shard loaded where the up (w3) shard goes and back: the fused w13 in the other
    order, weights and scales alike."""
    _wrap(monkeypatch, lambda layer, name, shard, expert: (_GATE_UP.get(shard, shard), expert))


def rotate_expert_scales(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each expert's weight scales loaded into the next expert's rows (the weights stay put): a scale grid read
    with the wrong expert stride."""
    def change(layer: Any, name: str, shard: str, expert: int) -> tuple[str, int]:
        return shard, (expert + 1) % layer.global_num_experts if "scale" in name else expert
    _wrap(monkeypatch, change)
