"""The production guard on integer weight-only (WNA16) MoE layers, in process under simulated archs through vLLM's
own layers and loaders: it names their read-sets WNA16_<backend> (adapter.families), passes healthy GPTQ, AWQ and
compressed-tensors exports (it once refused a healthy GPTQ: the zero-sized qzeros placeholders of a symmetric
export counted as unloaded, and MoeWNA16Method's converted writes as misplaced), and refuses an expert whose
scales were never loaded, naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantmatrix.adapter import layers
from quantmatrix.checkpoints import store
from quantmatrix.guard import plugin
from quantmatrix.guard.record import Recorder
from quantmatrix.measure import sentinel
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = load(ROOT / "matrices" / "default.yaml")
HEALTHY = ["qwen3moe-tiny-gptq-w4a16-g32", "qwen3moe-tiny-gptq-w8a16-g32", "qwen3moe-tiny-awq-w4a16-g32",
           "mixtral-tiny-awq-w4a16-g32", "qwen3moe-tiny-ct-w4a16-g32"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qm")


def _guarded(cache: Path, checkpoint_id: str, arch: str, monkeypatch: pytest.MonkeyPatch, leave_out: str = ""):
    """Every MoE layer vLLM builds on `arch`, fed the checkpoint (less the tensor `leave_out`) through its own
    loaders with the guard's recorder on, judged as the plugin judges a model: (outcome or refusal, build)."""
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(cache))
    path = store.materialize(next(c for c in DEFAULT.checkpoints if c.id == checkpoint_id))
    build = layers.build(path, DEFAULT.arch(arch).capability, every_layer=True)
    recorder = Recorder()
    for layer in build.layers:
        recorder.install(layer.block, layer.prefix)
        layer.load((n, t) for n, t in sentinel.checkpoint_tensors(path, layer.prefix)() if n != leave_out)
    try:
        return plugin.guard_model(recorder, build.layer.vllm_config.model_config, "refuse"), build
    except plugin.GuardRefusal as refusal:
        return refusal, build


@pytest.mark.parametrize("arch", ["sm121", "sm90"])
@pytest.mark.parametrize("checkpoint_id", HEALTHY)
def test_a_healthy_wna16_export_passes_the_guard_on_its_wna16_read_set(cache, monkeypatch, checkpoint_id, arch):
    outcome, build = _guarded(cache, checkpoint_id, arch, monkeypatch)
    assert not isinstance(outcome, plugin.GuardRefusal), str(outcome)
    moe = [r for r in outcome.layers if r.kind == "moe"]
    assert moe and all(r.backend == "WNA16_TRITON" and r.known_backend and r.weight_only for r in moe)
    assert outcome.problems == []


@pytest.mark.parametrize(("checkpoint_id", "leaf", "param"), [
    ("qwen3moe-tiny-gptq-w4a16-g32", "scales", "w2_scales"),
    ("qwen3moe-tiny-awq-w4a16-g32", "qzeros", "w2_qzeros"),
    ("qwen3moe-tiny-ct-w4a16-g32", "weight_scale", "w2_weight_scale"),
])
def test_an_expert_whose_tensor_was_never_loaded_is_refused_by_name(cache, monkeypatch, checkpoint_id, leaf, param):
    refusal, _ = _guarded(cache, checkpoint_id, "sm121", monkeypatch,
                          leave_out=f"model.layers.1.mlp.experts.2.down_proj.{leaf}")
    assert isinstance(refusal, plugin.GuardRefusal)
    assert (f"backend WNA16_TRITON reads tensors that were never loaded from the checkpoint: "
            f"model.layers.1.mlp.experts.routed_experts.{param} [expert 2]: unloaded (1/4 experts)") in str(refusal)
    assert str(refusal).count("unloaded") == 1, str(refusal)
