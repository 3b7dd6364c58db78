"""From a case and its group's engine run to a verdict: the plumbing between quality's oracles, the matrix's
thresholds and the reference files. Cheap oracles first: when a group's output is degenerate, the expensive
ones (a reference, another mode's engine start) are not evaluated; the degeneration case is already red.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantmatrix import bounded
from quantmatrix import properties as P
from quantmatrix.checks import quality
from quantmatrix.checks.verdict import Verdict
from quantmatrix.engine.runner import GroupRun
from quantmatrix.errors import MatrixError
from quantmatrix.schema.model import Case, Checkpoint

LoadReference = Callable[[str], dict[str, Any]]


def stated(checkpoint: Checkpoint, key: str) -> bool:
    return key in checkpoint.expect or key in checkpoint.scheme.expect


def _task(line: str) -> dict[str, Any]:
    """One task line; anything but a JSON object reads as {} (a bad line, named with the others)."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        return {}
    return row if isinstance(row, dict) else {}


def tasks(checkpoint: Checkpoint) -> list[dict[str, str]]:
    """The {prompt, answer} lines of a checkpoint's task file ([] when it states no accuracy)."""
    if not stated(checkpoint, "accuracy"):
        return []
    path: Path = checkpoint.expectation("accuracy")["tasks"]
    try:
        lines = [line for line in bounded.read_text(path, "tasks").splitlines() if line.strip()]
    except bounded.InputError as e:
        raise MatrixError(str(e)) from None
    rows = [_task(line) for line in lines]
    bad = [i for i, r in enumerate(rows, 1) if not isinstance(r.get("prompt"), str) or not isinstance(
        r.get("answer"), str)]
    if bad or not rows:
        raise MatrixError(f"{path}: every line must be {{\"prompt\": str, \"answer\": str}} (bad lines: "
                          f"{bad or 'the file is empty'})")
    return rows


def _routed(run: GroupRun) -> str:
    return f"[{run.routed()}]"


def run_properties(run: GroupRun) -> list[tuple[str, Any]]:
    """What the engine really did, for the JUnit report: routing, device, versions, poison, timings."""
    props: list[tuple[str, Any]] = [(P.ENGINE_GROUP, run.directory.name), (P.ENGINE_WALL_S, f"{run.wall_s:.1f}")]
    if run.failure is not None:
        return [*props, (P.ENGINE_FAILURE, run.failure.cause)]
    r = run.result
    assert r is not None
    props += [(P.MOE_ROUTED, run.routed()), (P.ENGINE_DEVICE, r["device"]["name"]),
              (P.ENGINE_VLLM, r["versions"][P.VLLM_VERSION]), (P.ENGINE_TORCH, r["versions"][P.TORCH_VERSION])]
    props += [(P.engine_timing(k), f"{v:.2f}") for k, v in sorted(r["timings"].items())]
    overhead = run.overhead_s()
    if overhead is not None:
        props.append((P.SUITE_OVERHEAD_S, f"{overhead:.1f}"))
    for w in run.workers():
        p = w["poison"]
        if p["requested"]:
            props.append((P.POISON, f"{p['requested']} in pid {p['pid']}: {p['parameters_filled']} parameters, "
                                    f"{p['allocations_filled']} allocations filled"))
    return props


def engine_problem(case: Case, run: GroupRun) -> str | None:
    """The run itself is unusable: it failed, or its poison mode did not take effect inside the engine."""
    return run_problem(case.cell.mode.name, run)


def run_problem(mode: str, run: GroupRun) -> str | None:
    """engine_problem for a run in `mode`."""
    if run.failure is not None:
        return f"the engine run failed: {run.failure.message()}"
    wanted = run.request["poison"]
    if wanted:
        states = [w["poison"] for w in run.workers()]
        off = [s for s in states if not s["active"] or s["requested"] != wanted]
        if not states or off:
            seen = "; ".join(f"pid {s['pid']}: registered_by={s['registered_by']}, requested={s['requested']}, "
                             f"models built={s['models_built']}" for s in states) or "no worker answered"
            return (f"mode {mode} asks for poison {wanted!r}, but the plugin did "
                    f"not fill the model inside the engine ({seen}); the mode proved nothing")
    guard = run.request.get("guard")
    if guard and not run.guard_ran():
        return (f"mode {mode} sets QUANTMATRIX_GUARD={guard!r}, but the engine log has no "
                f"'quantmatrix guard ran' line: the guard never judged the model (is quantmatrix_guard left out of "
                f"VLLM_PLUGINS?); the mode proved nothing (log: {run.directory / 'engine.log'})")
    return None


def _degeneration(case: Case, run: GroupRun) -> tuple[quality.Degeneration, list[str]]:
    metrics = quality.degeneration([o["token_ids"] for o in run.greedy()])
    return metrics, metrics.crossed(case.cell.checkpoint.expectation("degeneration"))


def greedy_properties(checkpoint: Checkpoint, run: GroupRun) -> list[tuple[str, str]]:
    """The cell's greedy tokens and each position's top-k (ranked ids), for the report's cross-arch comparison.
    k is the checkpoint's agreement_top_k: the tolerance the matrix states for a kernel's numerics against a
    reference, which another arch's kernel is; the run's logprobs count where the checkpoint states none."""
    k = checkpoint.expectation("agreement_top_k", default=None) or run.request["logprobs"]
    greedy = run.greedy()
    ranked = [[quality.top_k(step, k) for step in o["logprobs"]] for o in greedy]
    return [(P.GREEDY_TOKEN_IDS, P.encode_tokens([o["token_ids"] for o in greedy])),
            (P.GREEDY_TOP_K, P.encode_top_k(P.TopK(k, ranked)))]


def degeneration(case: Case, run: GroupRun) -> Verdict:
    properties = run_properties(run)
    broken = engine_problem(case, run)
    if broken:
        return Verdict.fail(case, broken, properties)
    metrics, crossed = _degeneration(case, run)
    properties.append((P.DEGENERATION, metrics.summary()))
    must = case.cell.checkpoint.expectation("degenerate")
    if not must:  # a canary's output is garbage by design: comparing it across archs would only be noise
        properties += greedy_properties(case.cell.checkpoint, run)
    return Verdict.of(case, degeneration_problem(_routed(run), metrics, crossed, must, run.greedy()), properties)


def degeneration_problem(routed: str, metrics: quality.Degeneration, crossed: list[str], must: bool,
                         greedy: list[dict[str, Any]]) -> str | None:
    """Degenerate output where the checkpoint `must` not give it, or a canary (`must`) that passed."""
    worst = greedy[metrics.worst_prompt]
    sample = f"worst continuation (prompt {metrics.worst_prompt}): {worst['token_ids']} {worst['text']!r}"
    if crossed and not must:
        return (f"{routed}: greedy output is degenerate: " + "; ".join(crossed) +
                f"\n{sample}\n(an expert path that outputs zeros or NaN looks exactly like this)")
    if must and not crossed:
        return (f"{routed}: this checkpoint is deliberately broken and must be flagged, but the "
                f"degeneration oracle passed it ({metrics.summary()}): the thresholds are too loose\n{sample}")
    return None


def _cheap_first(case: Case, run: GroupRun) -> Verdict | None:
    """The verdict when the case must not go on to its expensive oracle (a failed run, a degenerate group);
    None when it may."""
    broken = engine_problem(case, run)
    if broken:
        return Verdict.fail(case, broken, run_properties(run))
    _, crossed = _degeneration(case, run)
    if crossed:
        return Verdict.skip(f"{case.cell.id}: not evaluated, the group's output is degenerate "
                            f"({'; '.join(crossed)}); see its degeneration case", run_properties(run))
    return None


def _divergences(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], k: int, what: str
                 ) -> tuple[str | None, list[tuple[str, Any]]]:
    """Compare two runs (k = 0: exact): what broke the rule (None: nothing) and where each prompt diverged."""
    mismatch = quality.prompt_mismatch(ours, theirs)
    if mismatch:
        return f"cannot compare with {what}: {mismatch}", []
    divs = quality.exact(ours, theirs) if k == 0 else quality.compare(ours, theirs, k)
    where = [(P.FIRST_DIVERGENCE, ",".join(str(d.position) for d in divs))]
    bad = [d for d in divs if not d.within_top_k]
    if not bad:
        return None, where
    rule = "identical tokens" if k == 0 else f"a first divergence within each other's top-{k}"
    return f"{len(bad)} of {len(divs)} prompts break the rule ({rule}):\n{quality.describe(divs)}", where


def agreement(case: Case, run: GroupRun, reference: LoadReference) -> Verdict:
    stop = _cheap_first(case, run)
    if stop is not None:
        return stop
    ref = reference("outputs")
    k = case.cell.checkpoint.expectation("agreement_top_k")
    problem, where = agreement_problem(_routed(run), run.greedy(), ref, k)
    return Verdict.of(case, problem, run_properties(run) + where)


def agreement_problem(routed: str, greedy: list[dict[str, Any]], ref: dict[str, Any], k: int
                      ) -> tuple[str | None, list[tuple[str, Any]]]:
    """The engine's greedy output against a stored reference ({outputs, produced_by}), within top-`k`."""
    broken, where = _divergences(greedy, ref["outputs"], k, "the reference")
    by = ref["produced_by"]
    return (f"{routed}: greedy output disagrees with the reference ({by.get('source')}, "
            f"{by.get('date')}): {broken}") if broken else None, where


def invariance(case: Case, run: GroupRun, reference_run: Callable[[], GroupRun], reference_mode: str) -> Verdict:
    if case.cell.mode.name == reference_mode:
        raise MatrixError(f"{case.cell.id}: mode_invariance compares mode {reference_mode} with itself; "
                          f"exclude it from the check with except_cells: [{{mode: {reference_mode}}}]")
    stop = _cheap_first(case, run)
    if stop is not None:
        return stop
    base = reference_run()
    if base.failure is not None:
        return Verdict.fail(case, f"cannot compare with mode {reference_mode}: its engine run failed: "
                                  f"{base.failure.message()}", run_properties(run))
    k = case.cell.checkpoint.expectation("invariance_top_k")
    problem, where = invariance_problem(_routed(run), f"[{base.routed()}]", case.cell.mode.name, reference_mode,
                                       run.greedy(), base.greedy(), k)
    return Verdict.of(case, problem, run_properties(run) + where)


def invariance_problem(routed: str, base_routed: str, mode: str, reference_mode: str, greedy: list[dict[str, Any]],
                       base: list[dict[str, Any]], k: int) -> tuple[str | None, list[tuple[str, Any]]]:
    """`mode`'s greedy output against the `reference_mode`'s, within top-`k`."""
    broken, where = _divergences(greedy, base, k, f"mode {reference_mode}")
    return (f"{routed} vs {reference_mode} {base_routed}: mode {mode} changes greedy output, so something "
            f"reads memory nobody wrote: {broken}") if broken else None, where


def accuracy(case: Case, run: GroupRun, reference: LoadReference) -> Verdict:
    stop = _cheap_first(case, run)
    if stop is not None:
        return stop
    verdict, problem = accuracy_problem(_routed(run), [o["text"] for o in run.tasks()], tasks(case.cell.checkpoint),
                                        reference("accuracy"), case.cell.checkpoint.expectation("accuracy"))
    return Verdict.of(case, problem, [*run_properties(run), (P.ACCURACY, verdict.arithmetic())])


def accuracy_problem(routed: str, texts: list[str], rows: list[dict[str, str]], ref: dict[str, Any],
                     spec: dict[str, Any]) -> tuple[quality.AccuracyVerdict, str | None]:
    """The engine's answers (`texts`) to the task `rows`, against the stored reference accuracy (`ref`)."""
    solved = quality.score(texts, [r["answer"] for r in rows])
    verdict = quality.AccuracyVerdict(sum(solved), len(solved), ref["correct"], ref["n"], spec["z"],
                                      spec["max_drop"])
    if verdict.ok:
        return verdict, None
    misses = [rows[i]["prompt"] for i, ok in enumerate(solved) if not ok][:5]
    return verdict, (f"{routed}: task accuracy below the statistical bound: {verdict.arithmetic()}; "
                     f"first misses: {misses}")
