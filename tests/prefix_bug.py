"""vLLM as it was before the weight-only NVFP4 fix, for proving that quantmatrix catches the seed bug.

The fix in ModelOptNvFp4Config._from_config promotes quant_algo NVFP4 to W4A16_NVFP4 when every config group
has input_activations None. Hiding config_groups from the installed method undoes exactly that promotion and
nothing else.
"""

from __future__ import annotations

import pytest


def revert_weight_only_promotion(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

    fixed = ModelOptNvFp4Config._from_config.__func__

    def pre_fix(cls, *, original_config, **kwargs):
        unpromoted = {k: v for k, v in original_config.items() if k != "config_groups"}
        return fixed(cls, original_config=unpromoted, **kwargs)

    monkeypatch.setattr(ModelOptNvFp4Config, "_from_config", classmethod(pre_fix))
