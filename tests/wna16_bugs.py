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
- qzeros_next_rank: MoeWNA16Method's loader (moe_wna16.py, which GPTQ and AWQ fall back to) gives each
  tensor-parallel rank the next rank's part of the w13 zero points (an off-by-one in the rank it slices), so under
  tp 2 the ranks' gate and up zero points are swapped; the shapes still fit and nothing is refused.
"""

from __future__ import annotations

import inspect
import json
import os
import textwrap
from pathlib import Path
from typing import Any

import vllm_patch

CT_MOE = ("vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
          "compressed_tensors_moe")
QUANT_UTILS = "vllm.model_executor.layers.quantization.utils.quant_utils"
MOE_WNA16 = "vllm.model_executor.layers.quantization.moe_wna16"
BUGS = {"ct_wna16_unquantized": CT_MOE, "awq_sequential_order": QUANT_UTILS, "qzeros_next_rank": MOE_WNA16}
ENV = "QM_TEST_WNA16_BUGS"  # JSON list of the bugs this process carries

def install(tmp: Path, bugs: list[str]) -> dict[str, str]:
    """The environment under which every Python process carries `bugs`."""
    assert set(bugs) <= set(BUGS), bugs
    return {"PYTHONPATH": vllm_patch.install(tmp, {BUGS[b]: "wna16_bugs.apply" for b in bugs}),
            ENV: json.dumps(sorted(bugs))}


def _active(bug: str) -> bool:
    return bug in json.loads(os.environ.get(ENV, "[]"))


def apply(module: Any) -> None:
    if module.__name__ == CT_MOE and _active("ct_wna16_unquantized"):
        _ct_wna16_unquantized(module.CompressedTensorsMoEMethod)
    if module.__name__ == QUANT_UTILS and _active("awq_sequential_order"):
        module.awq_pack = _sequential_pack(module.pack_cols)
    if module.__name__ == MOE_WNA16 and _active("qzeros_next_rank"):
        _qzeros_next_rank(module.MoeWNA16Method)


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


def _qzeros_next_rank(cls: Any) -> None:
    """A source edit of MoeWNA16Method.get_weight_loader, compiled in the module's namespace."""
    source = textwrap.dedent(inspect.getsource(cls.get_weight_loader))
    own = "\n            )[tp_rank]\n"  # the w13_qzeros slice: view(tp_size, -1, groups)[tp_rank]
    assert source.count(own) == 1 and "w13_qzeros" in source, "vLLM's MoeWNA16 loader moved: update wna16_bugs.py"
    source = source.replace(own, "\n            )[(tp_rank + 1) % layer.moe_config.tp_size]\n")  # the bug
    namespace: dict[str, Any] = {}
    exec(compile(source.replace("@staticmethod\n", "", 1), inspect.getsourcefile(cls) or MOE_WNA16, "exec"),  # noqa: S102
         vars(inspect.getmodule(cls)), namespace)
    cls.get_weight_loader = staticmethod(namespace["get_weight_loader"])
