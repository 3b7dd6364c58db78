"""The poison plugin on plain torch modules (what it fills, what it leaves, what it reports), its vLLM seam and
entry point, and the rule that a poison mode whose plugin did not run fails."""

from __future__ import annotations

import importlib.metadata
import math
from pathlib import Path

import pytest
import torch

from quantmatrix.adapter import engine as adapter
from quantmatrix.checkpoints.producers import role_of
from quantmatrix.checks import e2e as verdicts
from quantmatrix.engine import poison
from quantmatrix.engine import runner as engine
from quantmatrix.schema.load import load
from quantmatrix.schema.model import Case, Cell

ROOT = Path(__file__).resolve().parent.parent


class _Experts(torch.nn.Module):
    """Like a MoE layer: weights and per-expert input scales made with torch.empty, a norm made with ones."""

    def __init__(self) -> None:
        super().__init__()
        self.w13_weight = torch.nn.Parameter(torch.empty(4, 8, 16, dtype=torch.uint8), requires_grad=False)
        self.w13_input_scale = torch.nn.Parameter(torch.empty(4, 2), requires_grad=False)
        self.norm = torch.nn.Parameter(torch.ones(16))
        self.register_buffer("cache", torch.arange(6, dtype=torch.float32))
        self.register_buffer("scratch", torch.empty(3))


@pytest.mark.parametrize("name", list(poison.VALUES))
def test_allocations_made_while_building_hold_the_value(name):
    """Every torch.empty* result while the model is built holds the poison; what the constructor computed
    (ones, arange) keeps its value."""
    with poison.poisoned_allocations(name) as mode:
        m = _Experts()
    assert mode.filled >= 3
    assert bool(poison.holds(m.w13_input_scale, name).all()) and bool(poison.holds(m.scratch, name).all())
    assert torch.equal(m.norm, torch.ones(16)) and torch.equal(m.cache, torch.arange(6.0))


def test_every_parameter_is_filled_before_loading():
    """poison_module fills all parameters (ones included) and counts buffers nobody computed."""
    with poison.poisoned_allocations("nan"):
        m = _Experts()
    params, buffers = poison.poison_module(m, "nan")
    assert params == 3 and buffers == 1  # scratch, not the computed cache
    assert bool(torch.isnan(m.norm).all())


@pytest.mark.parametrize(("dtype", "name", "value"), [
    (torch.float32, "nan", math.nan), (torch.bfloat16, "one", 1.0), (torch.uint8, "nan", 255),
    (torch.int32, "nan", -1), (torch.uint8, "one", 1), (torch.bool, "zero", False)])
def test_fill_value_per_dtype(dtype, name, value):
    """Integer storage (packed FP4) has no NaN: the 'nan' poison sets every bit, which is loud."""
    got = poison.fill_value(dtype, name)
    assert math.isnan(got) if isinstance(value, float) and math.isnan(value) else got == value


def test_fp8_scales_take_nan():
    """float8_e4m3fn block scales can hold the NaN poison (and it is recognised)."""
    t = torch.empty(4, dtype=torch.float8_e4m3fn)
    poison.fill(t, "nan")
    assert bool(poison.holds(t, "nan").all())


def test_after_load_the_unloaded_expert_rows_are_named(monkeypatch):
    """After loading, the audit names each MoE parameter still holding the poison and the expert rows that
    hold it entirely: the seed bug's never-loaded input_scale shows up as rows [0..3]."""
    m = _Experts()
    poison.poison_module(m, "nan")
    with torch.no_grad():
        m.w13_weight.copy_(torch.randint(0, 255, m.w13_weight.shape, dtype=torch.uint8))
        m.w13_input_scale[:3] = 0.5  # expert 3 never loaded
        m.norm.fill_(1.0)
    monkeypatch.setattr(poison, "STATE", poison.State())
    poison.audit_after_load(torch.nn.ModuleDict({"experts": m}), "nan", lambda mod: mod is m, role_of)
    found = poison.STATE.after_load["experts"]
    assert found["w13_input_scale"]["role"] == "input_scale"
    assert found["w13_input_scale"]["rows"] == [3] and not found["w13_input_scale"]["full"]
    assert found["w13_input_scale"]["elements"] == 2
    assert "norm" not in found


def test_a_byte_sentinel_matching_by_chance_is_counted_not_called_full():
    """Trap 1 of VLLM_FACTS: loaded packed bytes equal to the byte poison by chance are reported as a count
    (audit's judgement), never as a fully unloaded tensor."""
    t = torch.tensor([[255, 1], [2, 3]], dtype=torch.uint8)
    hit = poison.still_poisoned(t, "nan")
    assert hit["elements"] == 1 and not hit["full"] and hit["rows"] == []


def test_an_unknown_poison_value_is_an_error(monkeypatch):
    """QUANTMATRIX_POISON=nans is refused with the valid choices, never silently ignored."""
    monkeypatch.setenv(poison.ENV, "nans")
    with pytest.raises(ValueError, match="zero, one, nan"):
        poison.requested()


def test_register_wraps_the_vllm_loader_seam(monkeypatch):
    """With a poison requested, register() wraps vLLM's model build and post-load functions, once."""
    module, build, post = adapter.loader_seams()
    originals = getattr(module, build), getattr(module, post)
    monkeypatch.setattr(module, build, originals[0])
    monkeypatch.setattr(module, post, originals[1])
    monkeypatch.setattr(poison, "STATE", poison.State())
    monkeypatch.setenv(poison.ENV, "zero")
    poison.register(source="test")
    poison.register(source="again")
    assert getattr(module, build).__wrapped__ is originals[0]
    assert getattr(module, post).__wrapped__ is originals[1]
    assert (poison.STATE.registered_by, poison.STATE.requested) == ("test", "zero")


def test_the_package_declares_the_vllm_general_plugin():
    """pyproject ships `vllm.general_plugins: quantmatrix_poison`, resolving to poison.register."""
    tomllib = pytest.importorskip("tomllib")  # stdlib from Python 3.11
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    value = eps["vllm.general_plugins"]["quantmatrix_poison"]
    ep = importlib.metadata.EntryPoint("quantmatrix_poison", value, "vllm.general_plugins")
    assert ep.load() is poison.register


def _poison_case() -> Case:
    m = load(ROOT / "matrices" / "default.yaml")
    ck = next(c for c in m.checkpoints if c.id == "qwen3moe-tiny-bf16")
    return Case(m.checks["degeneration"], Cell(ck, m.archs[0], m.mode("poison_nan")), None)


def _run(worker_poison: dict) -> engine.GroupRun:
    out = {"prompt_token_ids": [1], "token_ids": list(range(32)), "logprobs": [], "text": "x"}
    result = {"status": "ok", "outputs": [out] * 8, "timings": {"load_s": 1.0, "generate_s": 1.0},
              "versions": {"vllm_version": "0", "torch_version": "0"}, "device": {"name": "cpu"},
              "workers": [{"pid": 2, "moe_layers": {}, "poison": worker_poison}]}
    return engine.GroupRun("c", Path("/nonexistent"), {"poison": "nan", "greedy_prompts": 8}, result, None, 3.0)


def test_a_poison_mode_whose_plugin_did_not_run_fails():
    """The engine answered, but its worker never filled a model: every check of the group fails, saying so."""
    inactive = {"active": False, "requested": None, "registered_by": None, "models_built": 0, "pid": 2,
                "parameters_filled": 0, "allocations_filled": 0}
    problem = verdicts.engine_problem(_poison_case(), _run(inactive))
    assert problem is not None and "did not fill the model" in problem and "poison_nan" in problem
    assert verdicts.degeneration(_poison_case(), _run(inactive)).problem == problem


def test_a_poison_mode_whose_plugin_ran_is_judged_on_its_output():
    """An active plugin in the worker: the run is usable and the output decides."""
    active = {"active": True, "requested": "nan", "registered_by": "engine_child", "models_built": 1, "pid": 2,
              "parameters_filled": 21, "allocations_filled": 12}
    assert verdicts.engine_problem(_poison_case(), _run(active)) is None
