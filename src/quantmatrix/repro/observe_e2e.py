"""The engine checks' observers for a repro script (lifted like repro.observe): the real vLLM engine started in
the script's own process with the cell's engine arguments and environment, its greedy continuations of the
night's prompts judged by the check's own oracle (checks.e2e, checks.quality) against the night's reference data
carried in CASE."""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

from quantmatrix.adapter import engine
from quantmatrix.checks import e2e, quality
from quantmatrix.engine.runner import Failure, GroupRun
from quantmatrix.repro.observe import Observed, Unobservable


def engine_run(case: dict[str, Any], where: dict[str, Path]) -> GroupRun:
    """One engine start on the bundle's checkpoint, as the cell's engine child ran it (request, environment)."""
    e = case["engine"]
    if e["needs_quantmatrix"]:
        raise Unobservable(f"mode {case['mode']['name']} works through quantmatrix's own vLLM plugin inside the "
                           f"engine ({e['needs_quantmatrix']}); the night's engine log, request and result are in "
                           "the bundle's engine/ folder")
    request = {**e["request"], "model": str(where["checkpoint"]), "poison": None}
    start = time.perf_counter()
    try:
        engine.import_engine()
        llm = engine.start(request["model"], request["engine_args"])
        outputs = engine.generate(llm, request["prompts"], request["max_tokens"], request["logprobs"])
    except Exception as error:  # noqa: BLE001 - an engine that fails is the observation, as in the engine child
        failure = Failure(f"{type(error).__name__} while starting or running the engine", str(error)[-4000:],
                          Path("(this process)"), traceback.format_exc()[-8000:])
        return GroupRun(case["cell"], where["script"].parent, request, None, failure, time.perf_counter() - start)
    # What the engine routed the experts to is not inspected here: LLM.apply_model ships its function to the
    # engine's processes by pickle, and a function of a script's __main__ does not survive the second hop.
    result = {"outputs": outputs, "workers": []}
    return GroupRun(case["cell"], where["script"].parent, request, result, None, time.perf_counter() - start)


def _routed(case: dict[str, Any]) -> str:
    """The routing the failing run's engine reported (this script does not inspect the engine's processes)."""
    return f"[the failing run routed: {case['recorded'].get('moe_routed', 'not recorded')}]"


def _facts(run: GroupRun) -> dict[str, Any]:
    if run.result is None:
        return {"engine_failure": run.failure.cause if run.failure else ""}
    return {"greedy_token_ids": [o["token_ids"] for o in run.greedy()]}


def _judged(case: dict[str, Any], run: GroupRun) -> tuple[str | None, list[str], quality.Degeneration | None]:
    """(the run's own problem, the degeneration thresholds it crossed, its degeneration metrics)."""
    broken = e2e.run_problem(case["mode"]["name"], run)
    if broken:
        return broken, [], None
    metrics = quality.degeneration([o["token_ids"] for o in run.greedy()])
    return None, metrics.crossed(case["expected"]["degeneration"]), metrics


def observe_degeneration(case: dict[str, Any], where: dict[str, Path]) -> Observed:
    """Greedy continuations must not be one token repeated (or, for a canary, must be)."""
    run = engine_run(case, where)
    broken, crossed, metrics = _judged(case, run)
    if broken or metrics is None:
        return broken, _facts(run)
    problem = e2e.degeneration_problem(_routed(case), metrics, crossed, case["expected"]["degenerate"],
                                       run.greedy())
    return problem, {**_facts(run), "degeneration": metrics.summary()}


def _cheap_first(case: dict[str, Any], run: GroupRun) -> Observed | None:
    broken, crossed, _ = _judged(case, run)
    if broken:
        return broken, _facts(run)
    if crossed:
        return None, {**_facts(run), "skipped": f"the output is degenerate ({'; '.join(crossed)}): the check is "
                                                "not evaluated; see the cell's degeneration case"}
    return None


def observe_agreement(case: dict[str, Any], where: dict[str, Path]) -> Observed:
    """At the first divergence from the stored reference, each token is within the other's top-k."""
    run = engine_run(case, where)
    stop = _cheap_first(case, run)
    if stop is not None:
        return stop
    e = case["expected"]
    problem, at = e2e.agreement_problem(_routed(case), run.greedy(), e["reference"], e["agreement_top_k"])
    return problem, {**_facts(run), **dict(at)}


def observe_mode_invariance(case: dict[str, Any], where: dict[str, Path]) -> Observed:
    """This mode's greedy tokens against the reference mode's, as the night's run of that mode gave them."""
    run = engine_run(case, where)
    stop = _cheap_first(case, run)
    if stop is not None:
        return stop
    e = case["expected"]
    problem, at = e2e.invariance_problem(_routed(case), e["base_routed"], case["mode"]["name"],
                                         e["reference_mode"], run.greedy(), e["base_outputs"], e["invariance_top_k"])
    return problem, {**_facts(run), **dict(at)}


def observe_task_accuracy(case: dict[str, Any], where: dict[str, Path]) -> Observed:
    """Accuracy on the offline task set against the Wilson bound of the stored reference accuracy."""
    run = engine_run(case, where)
    stop = _cheap_first(case, run)
    if stop is not None:
        return stop
    e = case["expected"]
    verdict, problem = e2e.accuracy_problem(_routed(case), [o["text"] for o in run.tasks()], e["tasks"],
                                            e["reference_accuracy"], e["accuracy"])
    return problem, {**_facts(run), "accuracy": verdict.arithmetic()}
