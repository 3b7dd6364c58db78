"""Hand-made vLLM FP8 and MIXED_PRECISION bugs, for proving that the cpu tier catches each one, naming the tensor or
the routing (issue 25).

As tests/shard_bugs.py does, `install(tmp, {checkpoint: bug})` writes a `sitecustomize.py` that patches vLLM's
modules as soon as they are imported, in every process that has the directory on PYTHONPATH (a child pytest, its
rank processes). The loader and method bugs act only while vLLM builds or loads the checkpoint they are given for
(its current config's model); the MIXED_PRECISION lookup runs outside any config, so it acts on every
MIXED_PRECISION config of a run that carries it.

- input_scale_dropped: a static FP8 MoE's loader returns before writing a per-tensor `input_scale` (the kernel then
  reads the value the parameter was created with).
- dynamic_as_static: compressed-tensors' FP8 MoE method sets `static_input_scales` for a dynamic checkpoint (the
  static kernel reads input scales nobody has).
- block_scale_transposed: a 128x128 block-scale grid (`weight_scale_inv`, `weight_scale` of FP8_BLOCK) loaded
  transposed (square grids: the shapes still fit).
- fused_under_unfused_name: ModelOpt MIXED_PRECISION looks a fused projection (qkv_proj, gate_up_proj) up under its
  own name only, never under the unfused names the checkpoint's `quantized_layers` lists (q_proj, ...): the fused
  layer is built unquantized and the checkpoint's FP8 scales have nowhere to go.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import vllm_patch

MODULES = {
    "vllm.model_executor.layers.fused_moe.routed_experts": "_routed_experts",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
    "compressed_tensors_moe_w8a8_fp8": "_ct_fp8",
    "vllm.model_executor.layers.quantization.modelopt": "_modelopt",
}
BUGS = ("input_scale_dropped", "dynamic_as_static", "block_scale_transposed", "fused_under_unfused_name")
ENV = "QM_TEST_FP8_BUGS"  # {checkpoint directory: bug}, JSON
RAN = "QM_TEST_FP8_BUGS_RAN"  # a file each bug appends its name to whenever its changed code runs

def install(tmp: Path, bugs: dict[Path, str]) -> dict[str, str]:
    """The environment under which every Python process carries the bugs, each for its checkpoint."""
    assert set(bugs.values()) <= set(BUGS), bugs
    patches = {module: f"fp8_bugs.{function}" for module, function in MODULES.items()}
    return {"PYTHONPATH": vllm_patch.install(tmp, patches),
            ENV: json.dumps({str(Path(c).resolve()): bug for c, bug in bugs.items()}), RAN: str(tmp / "ran.txt")}


def ran(env: dict[str, str]) -> set[str]:
    """The bugs whose changed code ran under `env` (install's), in any process."""
    log = Path(env[RAN])
    return set(log.read_text(encoding="utf-8").split()) if log.is_file() else set()


def _acted(bug: str) -> None:
    with open(os.environ[RAN], "a", encoding="utf-8") as log:
        log.write(bug + "\n")


def _bugs() -> dict[str, str]:
    return json.loads(os.environ.get(ENV, "{}"))


def _now() -> str | None:
    """The bug of the checkpoint vLLM is building or loading now, None otherwise."""
    checkpoint = vllm_patch.checkpoint_now()
    return _bugs().get(checkpoint) if checkpoint else None


def _routed_experts(module: Any) -> None:
    cls = module.RoutedExperts
    loader = cls.weight_loader

    def weight_loader(self, param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
        bug = _now()
        if bug == "input_scale_dropped" and "input_scale" in weight_name:
            _acted(bug)
            return True if return_success else None  # the bug: reported loaded, never written
        if bug == "block_scale_transposed" and weight_name.endswith(("weight_scale_inv", "weight_scale")) \
                and loaded_weight.dim() == 2 and getattr(self.quant_method, "block_quant", False):
            _acted(bug)
            loaded_weight = loaded_weight.t()  # the bug
        return loader(self, param, loaded_weight, weight_name, shard_id, expert_id, return_success)

    cls.weight_loader = weight_loader


def _ct_fp8(module: Any) -> None:
    cls = module.CompressedTensorsW8A8Fp8MoEMethod
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if _now() == "dynamic_as_static" and not self.block_quant:
            _acted("dynamic_as_static")
            self.static_input_scales = True  # the bug: the dynamic checkpoint gets the static path

    cls.__init__ = __init__


def _modelopt(module: Any) -> None:
    cls = module.ModelOptMixedPrecisionConfig
    resolve = cls._resolve_quant_algo

    def _resolve_quant_algo(self, prefix):
        if "fused_under_unfused_name" in _bugs().values() and prefix.rsplit(".", 1)[-1] in ("qkv_proj",
                                                                                             "gate_up_proj"):
            # the bug: only the fused name itself is looked up
            _acted("fused_under_unfused_name")
            for candidate in self._quantized_layer_prefix_candidates(prefix):
                if candidate in self.quantized_layers:
                    return self.quantized_layers[candidate]["quant_algo"].upper()
            return None
        return resolve(self, prefix)

    cls._resolve_quant_algo = _resolve_quant_algo
