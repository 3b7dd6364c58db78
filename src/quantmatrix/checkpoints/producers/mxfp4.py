"""OpenAI's gpt-oss export (`quant_method: mxfp4`) as a producer of MXFP4 checkpoints: its names and its config.

<experts>.gate_up_proj_blocks U8 [E, 2*ffn, hidden/32, 16] (gate and up rows interleaved, as transformers'
gate_up_proj columns), <experts>.gate_up_proj_scales U8 [E, 2*ffn, hidden/32] (E8M0), and down_proj_* alike
([E, hidden, ffn/32, 16], [E, hidden, ffn/32]); the biases (gate_up_proj_bias, down_proj_bias), router, attention
and embeddings stay bf16 and are listed in `modules_to_not_convert`. vLLM's Mxfp4Config reads none of that list
(from_config builds it with no ignored layers and every Linear runs unquantized): the config only names the
method.
"""

from __future__ import annotations

from typing import Any

from quantmatrix.checkpoints.configs import excluded_modules
from quantmatrix.schema.synthetic import SyntheticSpec

# role -> the suffix after a fused projection's name (`gate_up_proj_blocks`: adapter.roles.leaf strips the
# projection, as it strips vLLM's w13_ / w2_)
LEAVES = {"mxfp4": {"weight": "blocks", "block_scale": "scales"}}


class _Layout:
    """gpt-oss's names (schemes.mxfp4.Layout)."""

    @staticmethod
    def leaf(projection: str, role: str) -> str:
        return f"{projection}_{LEAVES['mxfp4'][role]}"


RECIPES = {"mxfp4": _Layout()}


def config_files(spec: SyntheticSpec, plain: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """gpt-oss's quantization_config: the method and the modules left bf16 (its own glob syntax)."""
    skip = [m.removesuffix("*") for m in excluded_modules(spec)] + ["model.embed_tokens"]
    qc = {"quant_method": "mxfp4", "modules_to_not_convert": sorted(skip)}
    return {**plain, "config.json": {**plain["config.json"], "quantization_config": qc}}
