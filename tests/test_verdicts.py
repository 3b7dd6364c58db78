"""Verdicts on constructed engine runs: cheap oracles first, invariance exact or within top-k, task accuracy
against a stored reference with its Wilson bound, and every message naming the cell and what was routed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from quantmatrix import properties as P
from quantmatrix.checks import e2e as verdicts
from quantmatrix.engine import runner as engine
from quantmatrix.schema.load import load
from quantmatrix.schema.model import Case, Cell

MATRIX = """\
version: 1
archs: [{name: sm121, capability: "12.1", label: GB10}]
modes:
  - {name: default, label: d}
  - {name: poison_zero, env: {QUANTMATRIX_POISON: zero}, label: z}
schemes:
  - name: nvfp4_weight_only
    marker: weight_only
    label: W4A16
    expect:
      degeneration: {max_repeat_run: 6, min_distinct_1: 0.2, min_distinct_2: 0.3, max_compression_ratio: 6}
      degenerate: false
      reference: engine
      agreement_top_k: 2
      invariance_top_k: 0
      accuracy: {tasks: tasks.jsonl, z: 1.96, max_drop: 0.0}
checks:
  - {name: degeneration, kind: e2e, tier: cpu, description: d}
checkpoints:
  - {id: real-tiny, source: {path: ck}, producer: modelopt, scheme: nvfp4_weight_only}
e2e: {prompts: p.txt, references: refs, max_tokens: 8, logprobs: 2, timeout_s: 5, reference_mode: default}
"""
TASKS = [{"prompt": f"Q: {i} + 1?\nA:", "answer": str(i + 1)} for i in range(10)]
GREEDY = [list(range(8)), list(range(10, 18))]


@pytest.fixture
def cells(tmp_path: Path) -> dict[str, Case]:
    (tmp_path / "m.yaml").write_text(MATRIX)
    (tmp_path / "p.txt").write_text("a\nb\n")
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    m = load(tmp_path / "m.yaml")
    check = m.checks["degeneration"]
    return {mode.name: Case(check, Cell(m.checkpoints[0], m.archs[0], mode), None) for mode in m.modes}


def _run(greedy: list[list[int]], answers: list[str], poison: str | None = None) -> engine.GroupRun:
    outs = [{"prompt_token_ids": [i], "token_ids": t, "text": "", "logprobs": [{str(x): -1.0} for x in t]}
            for i, t in enumerate(greedy)]
    outs += [{"prompt_token_ids": [100 + i], "token_ids": [1], "text": f" {a}\n", "logprobs": []}
             for i, a in enumerate(answers)]
    layer = {"quant_method": "ModelOptNvFp4FusedMoE", "backend": "VLLM_CUTLASS"}
    worker = {"pid": 7, "moe_layers": {"model.layers.0.mlp.experts": layer},
              "poison": {"active": poison is not None, "requested": poison, "registered_by": "engine_child",
                         "models_built": 1, "pid": 7, "parameters_filled": 9, "allocations_filled": 3}}
    result = {"status": "ok", "outputs": outs, "timings": {"load_s": 1.0, "generate_s": 1.0, "import_s": 1.0},
              "versions": {"vllm_version": "0.32.0", "torch_version": "2.13"}, "device": {"name": "GB10"},
              "workers": [worker]}
    return engine.GroupRun("c", Path("/x/group"), {"poison": poison, "greedy_prompts": len(greedy)}, result,
                           None, 5.0)


def _refs(correct: int, n: int = 10) -> verdicts.LoadReference:
    return lambda kind: {"correct": correct, "n": n, "produced_by": {"source": "engine"}}


def test_accuracy_within_the_wilson_bound_passes_and_below_fails(cells):
    """8/10 against a stored 9/10 passes (lower bound 0.596); 5/10 fails, with the arithmetic and the misses."""
    good = [str(i + 1) for i in range(8)] + ["x", "x"]
    bad = [str(i + 1) for i in range(5)] + ["x"] * 5
    assert verdicts.accuracy(cells["default"], _run(GREEDY, good), _refs(9)).problem is None
    problem = verdicts.accuracy(cells["default"], _run(GREEDY, bad), _refs(9)).message
    assert problem.startswith(f"real-tiny@sm121-default {cells['default'].check.name}: "
                              "[ModelOptNvFp4FusedMoE/VLLM_CUTLASS x1]: task accuracy")
    assert "5/10" in problem and "pass line = lower bound 0.596" in problem and "Q: 5 + 1?" in problem


def test_a_degenerate_group_skips_its_expensive_oracles_without_reading_a_reference(cells):
    """Cheap first: one token repeated -> agreement and accuracy are skipped, and no reference is loaded."""
    stuck = _run([[3] * 8, [3] * 8], ["1"] * 10)

    def no_reference(kind: str) -> dict:
        raise AssertionError("a degenerate group must not need its reference")

    for oracle in (verdicts.agreement, verdicts.accuracy):
        v = oracle(cells["default"], stuck, no_reference)
        assert v.problem is None and "degenerate" in v.reason
    assert "one token repeated 8 times" in verdicts.degeneration(cells["default"], stuck).problem


def test_mode_invariance_is_exact_at_k_0_and_names_both_routings(cells):
    """invariance_top_k 0: a single changed token fails, citing the reference mode and its routing."""
    changed = [GREEDY[0][:4] + [99, 98, 97, 96], GREEDY[1]]
    v = verdicts.invariance(cells["poison_zero"], _run(changed, ["1"] * 10, "zero"),
                            lambda: _run(GREEDY, ["1"] * 10), "default")
    assert "vs default [ModelOptNvFp4FusedMoE/VLLM_CUTLASS x1]: mode poison_zero changes greedy output" in v.problem
    assert "prompt 0: first divergence at position 4" in v.problem
    same = verdicts.invariance(cells["poison_zero"], _run(GREEDY, ["1"] * 10, "zero"),
                               lambda: _run(GREEDY, ["1"] * 10), "default")
    assert same.problem is None and (P.FIRST_DIVERGENCE, "8,8") in same.properties


def test_the_reference_mode_is_never_compared_with_itself(cells):
    """A matrix that forgot to exclude the reference mode from mode_invariance is told how to fix it."""
    with pytest.raises(Exception, match="except_cells"):
        verdicts.invariance(cells["default"], _run(GREEDY, []), lambda: _run(GREEDY, []), "default")


def test_a_failed_engine_run_fails_every_check_with_its_cause(cells):
    """No result: each oracle's problem is the run's failure, with the cause and the log tail."""
    failure = engine.Failure("CUDA OOM", "OutOfMemoryError: CUDA out of memory", Path("/x/engine.log"), "last line")
    run = engine.GroupRun("c", Path("/x/g"), {"poison": None, "greedy_prompts": 2}, None, failure, 9.0)
    for v in (verdicts.degeneration(cells["default"], run), verdicts.agreement(cells["default"], run, _refs(1))):
        assert v.message.startswith(f"real-tiny@sm121-default {cells['default'].check.name}: the engine run failed: "
                                    "CUDA OOM")
        assert "last line" in v.problem and (P.ENGINE_FAILURE, "CUDA OOM") in v.properties


def _ranked_run(greedy: list[list[int]]) -> engine.GroupRun:
    """A run whose every position ranks its greedy token first, then +1, then +2 (NaN for the last)."""
    run = _run(greedy, [])
    for out in run.result["outputs"]:
        out["logprobs"] = [{str(t + 2): None, str(t + 1): -2.0, str(t): -1.0, str(t + 3): -3.0}
                           for t in out["token_ids"]]
    return dataclasses.replace(run, request={**run.request, "logprobs": 3})


def test_degeneration_records_the_cells_greedy_tokens_and_top_k_once_for_the_cross_arch_report(cells):
    """k is the checkpoint's agreement_top_k (2 here, of the 3 logprobs recorded; a NaN is never ranked), or the
    run's logprobs count where it states none; the properties decode to what the engine returned."""
    v = verdicts.degeneration(cells["default"], _ranked_run(GREEDY))
    props = dict(v.properties)
    assert v.problem is None and len(props) == len(v.properties)
    assert {P.ENGINE_GROUP, P.DEGENERATION} <= set(props)  # beside what the run and the oracle recorded
    assert P.decode_tokens(props[P.GREEDY_TOKEN_IDS]) == GREEDY
    top = P.decode_top_k(props[P.GREEDY_TOP_K])
    assert (top.k, top.ranked[1][:2]) == (2, [[10, 11], [11, 12]])
    ck = cells["default"].cell.checkpoint
    unstated = dataclasses.replace(ck, scheme=dataclasses.replace(
        ck.scheme, expect={k: v for k, v in ck.scheme.expect.items() if k != "agreement_top_k"}))
    case = dataclasses.replace(cells["default"], cell=dataclasses.replace(cells["default"].cell, checkpoint=unstated))
    top = P.decode_top_k(dict(verdicts.degeneration(case, _ranked_run(GREEDY)).properties)[P.GREEDY_TOP_K])
    assert (top.k, top.ranked[0][0]) == (3, [0, 1, 3])


def test_a_canary_or_a_failed_run_records_no_greedy_output(cells):
    """A deliberately broken checkpoint's output is garbage by design, and a failed run has none."""
    ck = cells["default"].cell.checkpoint
    canary = dataclasses.replace(ck, expect={**ck.expect, "degenerate": True})
    case = dataclasses.replace(cells["default"], cell=dataclasses.replace(cells["default"].cell, checkpoint=canary))
    stuck = _run([[3] * 8, [3] * 8], [])
    v = verdicts.degeneration(case, stuck)
    assert v.problem is None and P.GREEDY_TOKEN_IDS not in dict(v.properties)
    failure = engine.Failure("CUDA OOM", "d", Path("/x/log"), "last line")
    failed = engine.GroupRun("c", Path("/x/g"), {"poison": None, "greedy_prompts": 2}, None, failure, 9.0)
    names = {name for name, _ in verdicts.degeneration(cells["default"], failed).properties}
    assert names.isdisjoint({P.GREEDY_TOKEN_IDS, P.GREEDY_TOP_K})
