"""Hand-made vLLM bugs in the integer weight-only (WNA16) path, for proving that the cpu tier catches each one by
tensor or routing. Like tests/shard_bugs.py, each patches vLLM in a child process only: `install(tmp, bugs)` writes
a `sitecustomize.py` that patches each module right after vLLM imports it, in every process that has the directory
on PYTHONPATH. A bug acts in the whole child run; the test picks cases the others cannot touch.

- ct_wna16_unquantized: compressed-tensors resolves a W4A16 / W8A16 MoE to vLLM's unquantized MoE method (as when
  the fused experts miss the config's target scheme map and look ignored): bf16 expert weights the packed ints
  never fill.
- awq_sequential_order: vLLM's AWQ packing helper (`quant_utils.awq_pack`) loses its interleave and packs in GPTQ's
  sequential order, so whatever reads AWQ's order off it (the dequant_logits decode) reads AWQ's qweight and qzeros
  in GPTQ order.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CT_MOE = ("vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
          "compressed_tensors_moe")
QUANT_UTILS = "vllm.model_executor.layers.quantization.utils.quant_utils"
BUGS = {"ct_wna16_unquantized": CT_MOE, "awq_sequential_order": QUANT_UTILS}
ENV = "QM_TEST_WNA16_BUGS"  # JSON list of the bugs this process carries

_SITECUSTOMIZE = '''
import importlib.abc
import sys


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patch the modules of the test's hand-made vLLM changes right after each executes."""

    pending = set({modules!r})

    def find_spec(self, name, path, target=None):
        if name not in self.pending:
            return None
        self.pending.discard(name)
        import importlib.util

        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            import wna16_bugs

            wna16_bugs.apply(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchOnImport())
'''


def install(tmp: Path, bugs: list[str]) -> dict[str, str]:
    """The environment under which every Python process carries `bugs`: PYTHONPATH with a sitecustomize.py (and
    this tests/ directory) first."""
    assert set(bugs) <= set(BUGS), bugs
    where = tmp / "sitecustomize"
    where.mkdir(exist_ok=True)
    modules = sorted({BUGS[b] for b in bugs})
    (where / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(modules=modules), encoding="utf-8")
    path = [str(where), str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in path if p), ENV: json.dumps(sorted(bugs))}


def _active(bug: str) -> bool:
    return bug in json.loads(os.environ.get(ENV, "[]"))


def apply(module: Any) -> None:
    if module.__name__ == CT_MOE and _active("ct_wna16_unquantized"):
        _ct_wna16_unquantized(module.CompressedTensorsMoEMethod)
    if module.__name__ == QUANT_UTILS and _active("awq_sequential_order"):
        module.awq_pack = _sequential_pack(module.pack_cols)


def _ct_wna16_unquantized(cls: Any) -> None:
    get_moe_method = cls.get_moe_method

    def patched(quant_config, layer, layer_name):
        method = get_moe_method(quant_config, layer, layer_name)
        if type(method).__name__ != "CompressedTensorsWNA16MoEMethod":
            return method
        from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

        return UnquantizedFusedMoEMethod(layer.moe_config)  # the bug

    cls.get_moe_method = staticmethod(patched)


def _sequential_pack(pack_cols: Any) -> Any:
    def awq_pack(q_w, num_bits, size_k, size_n):
        assert q_w.shape == (size_k, size_n)
        return pack_cols(q_w, num_bits, size_k, size_n)  # the bug: no AWQ interleave

    return awq_pack
