"""Runs inside each engine worker (adapter.engine.on_every_worker): what the engine really built, plus what the
poison plugin did in that process and the sanitize mode's parameter record (engine.params). The plugins' state is
read here, so a plugin that never ran reports itself inactive instead of being assumed."""

from __future__ import annotations

import os
from typing import Any

from quantmatrix.adapter.engine import moe_layer_facts
from quantmatrix.engine import params, poison


def inspect_model(model: Any) -> dict[str, Any]:
    return {"pid": os.getpid(), "moe_layers": moe_layer_facts(model), "poison": poison.STATE.as_dict(),
            "params": params.STATE.as_dict()}
