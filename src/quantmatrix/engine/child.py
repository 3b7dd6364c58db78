"""`python -m quantmatrix.engine.child REQUEST RESULT`: one vLLM engine run, in its own process group.

The parent (engine.runner) sets the mode's environment and reads RESULT, written once and atomically:
either {"status": "ok", ...} (outputs, timings, versions, device, what the engine built) or {"status":
"failed", "stage", "error_type", "error", "traceback"}. A child that dies or hangs writes nothing; the parent
says why from the exit status and the log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from quantmatrix.adapter.versions import versions
from quantmatrix.atomic import dump_json, write_atomic
from quantmatrix.engine.protocol import CHILD_MODULE, FAULT_ENV


def _test_fault() -> None:
    fault = os.environ.get(FAULT_ENV)
    if not fault:
        return
    print(f"engine_child: {FAULT_ENV}={fault}", flush=True)
    if fault == "hang":
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        print(f"engine_child: grandchild pid {sleeper.pid}", flush=True)
        time.sleep(3600)
    elif fault == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif fault == "exit":
        print("engine_child: giving up on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    else:
        raise SystemExit(f"engine_child: unknown {FAULT_ENV}={fault!r} (hang, segfault, exit)")


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Start the engine, generate, look inside; every stage is timed and named, so a failure says where."""
    timings: dict[str, float] = {}
    stage = "import"
    start = time.perf_counter()
    try:
        from quantmatrix.adapter import engine as adapter
        from quantmatrix.engine import params, poison
        from quantmatrix.engine.inspect import inspect_model

        adapter.import_engine()
        poison.register(source="engine_child")
        params.register(source="engine_child")
        timings["import_s"] = time.perf_counter() - start
        stage = "load"
        t = time.perf_counter()
        llm = adapter.start(request["model"], request["engine_args"])
        timings["load_s"] = time.perf_counter() - t
        stage = "generate"
        t = time.perf_counter()
        outputs = adapter.generate(llm, request["prompts"], request["max_tokens"], request["logprobs"])
        timings["generate_s"] = time.perf_counter() - t
        stage = "inspect"
        t = time.perf_counter()
        workers = adapter.on_every_worker(llm, inspect_model)
        timings["inspect_s"] = time.perf_counter() - t
        return {"status": "ok", "outputs": outputs, "timings": timings,
                "versions": versions(), "device": adapter.device(), "workers": workers,
                "child_pid": os.getpid()}
    except Exception as e:  # noqa: BLE001 - every engine failure becomes data for the case message
        return {"status": "failed", "stage": stage, "error_type": type(e).__name__, "error": str(e)[-4000:],
                "traceback": traceback.format_exc()[-8000:], "timings": timings}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: python -m {CHILD_MODULE} REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    _test_fault()
    result = run(request)
    write_atomic(Path(argv[1]), dump_json(result))
    sys.stdout.flush()
    # Engine shutdown can take seconds or hang on a broken engine: the result is safe, leave now. The parent
    # kills what is left of the process group.
    os._exit(0 if result["status"] == "ok" else 1)


if __name__ == "__mp_main__":
    # vLLM spawns its engine-core and worker processes, which import this module under that name: installing
    # the poison seam (and the sanitize mode's parameter record) here puts it into every engine process even where
    # the entry point is not installed.
    from quantmatrix.engine import params as _params
    from quantmatrix.engine import poison as _poison

    _poison.register(source="engine_child")
    _params.register(source="engine_child")

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
