"""Cost of the production guard at load: vLLM's model load (BaseModelLoader.load_model: build, load weights,
post-process) of the tiny bf16 models with and without QUANTMATRIX_GUARD=refuse, side by side, plus the guard's own
time as it logs it (hooking the weight loaders and judging). Target: at most 2% of the load time. After load the
guard costs nothing (nothing is hooked on the forward path).

One child per model runs the engine in its own process (VLLM_ENABLE_V1_MULTIPROCESSING=0, uni executor) and starts
it 1 + 2 x REPEAT times (a discarded warm-up, then guard off / on alternating, so both see warm caches).
Run: `.venv/bin/python bench/bench_guard.py [--repeat N] [--models ID ...]`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("qwen3moe-tiny-bf16", "mixtral-tiny-bf16")
GUARD_LINE = re.compile(r"quantmatrix guard ran \(\w+\): checked (\d+) tensors .* in ([0-9.]+) s")


def child(model: str, engine_args: dict, repeat: int) -> None:
    import gc

    import vllm
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    from quantmatrix.adapter import engine
    from quantmatrix.guard import plugin

    # vLLM calls the plugin once per process, at the first start; install the seams now (they read
    # QUANTMATRIX_GUARD at every model load), so the starts below can alternate.
    os.environ[plugin.ENV] = "refuse"
    plugin.register()
    loads: list[float] = []
    engine.timed_model_loads(loads)
    runs = []
    schedule = [None] + [g for _ in range(repeat) for g in (None, "refuse")]  # the first start warms caches
    for i, guard in enumerate(schedule):
        if guard is None:
            os.environ.pop(plugin.ENV, None)
        else:
            os.environ[plugin.ENV] = guard
        print(f"=== bench start {i}", flush=True)  # vLLM logs to stdout: the parent finds the guard's line here
        llm = vllm.LLM(model=model, **engine_args)
        del llm
        gc.collect()
        destroy_model_parallel()
        destroy_distributed_environment()
        if i:
            runs.append({"guard": guard, "load_s": loads[-1]})
    print("BENCH " + json.dumps(runs), flush=True)
    os._exit(0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--models", nargs="*", default=list(MODELS))
    p.add_argument("--child", nargs=3, metavar=("MODEL", "ENGINE_ARGS", "REPEAT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child[0], json.loads(args.child[1]), int(args.child[2]))
    from quantmatrix.checkpoints import store
    from quantmatrix.engine import runner
    from quantmatrix.schema.load import load
    from quantmatrix.schema.model import Cell

    matrix = load(ROOT / "matrices" / "default.yaml")
    print("load s: BaseModelLoader.load_model, median (min) of the starts; delta: of the medians (on a busy host it "
          "is noise); guard own s: the guard's hooking + judging, as it logs it; own/load: of the unguarded median")
    print(f"{'model':<20} {'load s, no guard':>17} {'load s, guard':>17} {'delta':>7} {'guard own s':>12} "
          f"{'own/load':>9} {'tensors':>8}")
    for model_id in args.models:
        ck = next(c for c in matrix.checkpoints if c.id == model_id)
        cell = Cell(ck, matrix.arch("sm121"), matrix.mode("default"))
        path = store.materialize(ck)
        engine_args = {**runner.engine_args(matrix.e2e, cell, "cpu"), "distributed_executor_backend": "uni"}
        env = {**runner.child_env(matrix.e2e, cell, "cpu", os.environ), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        env.pop("QUANTMATRIX_GUARD", None)
        out = subprocess.run([sys.executable, __file__, "--child", str(path), json.dumps(engine_args),
                              str(args.repeat)], env=env, capture_output=True, text=True, timeout=1800)
        line = next((x for x in out.stdout.splitlines() if x.startswith("BENCH ")), None)
        if line is None:
            sys.exit(f"{model_id}: the bench child failed (exit {out.returncode}):\n{out.stdout[-3000:]}"
                     f"{out.stderr[-3000:]}")
        runs = json.loads(line[6:])
        segments = out.stdout.split("=== bench start ")[2:]  # [0]: before any start, [1]: the warm-up
        for run, segment in zip(runs, segments, strict=True):
            found = GUARD_LINE.search(segment)
            run["guard_s"], run["tensors"] = (float(found.group(2)), int(found.group(1))) if found else (None, None)
            if bool(found) != bool(run["guard"]):
                sys.exit(f"{model_id}: guard {run['guard']!r} but its log line {'is' if found else 'is not'} there")
        offs = [r["load_s"] for r in runs if r["guard"] is None]
        ons = [r["load_s"] for r in runs if r["guard"]]
        off, on = statistics.median(offs), statistics.median(ons)
        own = statistics.median(r["guard_s"] for r in runs if r["guard"])
        tensors = next(r["tensors"] for r in runs if r["guard"])
        print(f"{model_id:<20} {f'{off:.3f} ({min(offs):.3f})':>17} {f'{on:.3f} ({min(ons):.3f})':>17} "
              f"{100 * (on - off) / off:>6.1f}% {own:>12.4f} {100 * own / off:>8.2f}% {tensors:>8}")


if __name__ == "__main__":
    main()
