"""Child of tests/test_guard.py: the production guard at every rank of a parallel layout, in a real gloo world (one
forked process per rank, adapter.parallel, as measure.pool starts them): each rank builds every MoE block of the
checkpoint, wraps its weight loaders with the guard's recorder, loads the checkpoint through them and has the guard
judge it (warn). vLLM may carry a hand-made bug (tests/shard_bugs.py, through PYTHONPATH). The stdout line after
RESULT_MARK is JSON: per rank, the guard's problems as the refusal would name them.

usage: python guard_ranks.py CHECKPOINT TP EP(0|1) MAJOR.MINOR
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import tempfile
import traceback
from pathlib import Path

RESULT_MARK = "guard_ranks result: "


def _rank(conn, path: Path, tp: int, ep: bool, rank: int, capability: tuple[int, int], init_file: str) -> None:
    try:
        from quantmatrix.adapter import layers, parallel
        from quantmatrix.guard import plugin
        from quantmatrix.guard.record import Recorder
        from quantmatrix.measure import sentinel

        parallel.init_rank(tp, ep, rank, init_file)
        build = layers.build(path, capability, every_layer=True)
        recorder = Recorder()
        for layer in build.layers:
            recorder.install(layer.block, layer.prefix)
            layer.load(sentinel.checkpoint_tensors(path, layer.prefix)())
        outcome = plugin.guard_model(recorder, build.layer.vllm_config.model_config, "warn")
        conn.send({"tensors": outcome.tensors, "problems": [f.describe() for _, f in outcome.problems]})
    except BaseException:  # noqa: BLE001 - the rank's failure is the answer
        conn.send({"error": traceback.format_exc()})
    os._exit(0)


def main() -> None:
    import importlib

    from quantmatrix.adapter import layers

    for module in layers.MODULES:  # imported once, before the ranks fork (as measure.pool does)
        importlib.import_module(module)
    path, tp, ep = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    capability = tuple(int(x) for x in sys.argv[4].split("."))
    init_file = tempfile.mktemp(prefix="guard-ranks-")
    conns = []
    for rank in range(tp):
        parent, child = multiprocessing.Pipe()
        if os.fork() == 0:
            _rank(child, path, tp, ep, rank, capability, init_file)
        conns.append(parent)
    print(RESULT_MARK + json.dumps([c.recv() for c in conns]), flush=True)  # the caller kills the ranks' process group
    os._exit(0)


if __name__ == "__main__":
    main()
