"""Issue 25's hand-made vLLM changes (tests/fp8_bugs.py), each installed in a child pytest for its own checkpoint,
turn the cpu tier red with a message naming the tensor or the routing; the same cases run against the unchanged
vLLM are green (so each assertion below can fail). A bug counts only as a case that failed on its assertion (not
an error), with the bug's changed code shown to have run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import fp8_bugs
import pytest
import vllm_patch

from quantmatrix.checkpoints import store
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = load(ROOT / "matrices" / "default.yaml")
FUSED = "model.layers.0.mlp.experts.routed_experts"
EXPERTS = "model.layers.0.mlp.experts"
# node -> the bug its checkpoint carries in the patched run
CASES = {
    "test_layers.py::test_rank_shards[qwen3moe-tiny-mo-fp8@sm121-default]": "input_scale_dropped",
    "test_layers.py::test_layer_dispatch[qwen3moe-tiny-ct-fp8-dynamic@sm121-default]": "dynamic_as_static",
    "test_layers.py::test_rank_shards[qwen3moe-tiny-hf-fp8-block@sm121-default]": "block_scale_transposed",
    "test_dispatch.py::test_config_dispatch[qwen3moe-tiny-mo-mixed@sm121-default]": "fused_under_unfused_name",
}


def _checkpoint_dir(node: str) -> Path:
    checkpoint_id = node.split("[", 1)[1].split("@", 1)[0]
    return store.materialize(next(c for c in DEFAULT.checkpoints if c.id == checkpoint_id))


def _run(tmp: Path, env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """One child pytest over CASES: node -> (outcome, message)."""
    return vllm_patch.child_pytest(tmp, [f"suites/{node}" for node in CASES], env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same cases against the unchanged vLLM ("plain") and with each checkpoint's bug ("bugged")."""
    bugs = {_checkpoint_dir(node): bug for node, bug in CASES.items()}
    plain_tmp, bugged_tmp = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("bugged")
    env = fp8_bugs.install(bugged_tmp, bugs)
    plain = {k: v for k, v in os.environ.items() if k not in (fp8_bugs.ENV, fp8_bugs.RAN)}
    return {"plain": _run(plain_tmp, plain), "bugged": _run(bugged_tmp, {**os.environ, **env}),
            "ran": fp8_bugs.ran(env)}


def test_the_unchanged_vllm_passes_every_case(runs):
    assert runs["plain"] == {node: ("passed", "") for node in CASES}


def test_every_bug_s_changed_code_ran_in_the_bugged_run(runs):
    assert runs["ran"] == set(CASES.values()) == set(fp8_bugs.BUGS)


def test_a_static_fp8_moe_that_drops_its_input_scale_is_red_naming_the_scale(runs):
    outcome, message = runs["bugged"]["test_layers.py::test_rank_shards[qwen3moe-tiny-mo-fp8@sm121-default]"]
    assert outcome == "failed"
    assert message.startswith("qwen3moe-tiny-mo-fp8@sm121-default rank_shards: "), message
    assert f"rank 0 {FUSED}.w13_input_scale (expert 0)" in message, message
    assert f"must hold {EXPERTS}.0.gate_proj.input_scale" in message, message


def test_a_dynamic_fp8_checkpoint_handed_a_static_kernel_is_red_naming_the_routing(runs):
    outcome, message = runs["bugged"][
        "test_layers.py::test_layer_dispatch[qwen3moe-tiny-ct-fp8-dynamic@sm121-default]"]
    assert outcome == "failed"
    assert ("dynamic-activation FP8 checkpoint built as static-activation FP8 MoE (CompressedTensorsW8A8Fp8MoEMethod"
            in message), message
    assert "the kernel would read a per-tensor input_scale the checkpoint never filled" in message, message


def test_block_scales_loaded_transposed_are_red_naming_the_block_scale(runs):
    outcome, message = runs["bugged"]["test_layers.py::test_rank_shards[qwen3moe-tiny-hf-fp8-block@sm121-default]"]
    assert outcome == "failed"
    assert (f"rank 0 {FUSED}.w13_weight_scale_inv (expert 0) [0:2, 0:2] must hold "
            f"{EXPERTS}.0.gate_proj.weight_scale_inv[0:2, 0:2]: wrong (holds other data)") in message, message


def test_mixed_precision_looking_a_fused_projection_up_under_its_own_name_is_red_naming_it(runs):
    outcome, message = runs["bugged"]["test_dispatch.py::test_config_dispatch[qwen3moe-tiny-mo-mixed@sm121-default]"]
    assert outcome == "failed"
    assert message.startswith("qwen3moe-tiny-mo-mixed@sm121-default config_dispatch: 1 of 7 MIXED_PRECISION linear "
                              "module(s) built other than the checkpoint declares: "), message
    assert ("model.layers.0.self_attn.qkv_proj (loads q_proj, k_proj, v_proj): quantized_layers declares "
            "static-activation FP8, vLLM built UnquantizedLinearMethod (unquantized): its quantized weights would be "
            "loaded into a bf16 layer and their scales dropped") in message, message
