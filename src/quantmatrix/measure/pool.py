"""The rank processes: one process per rank, in a real gloo world, as vLLM serves tensor parallelism on a CPU.

A pytest process starts one child (`python -m quantmatrix.measure.pool`) that imports vLLM once and then forks a
layout's ranks (vLLM's own workers are forked too): each rank joins the world with vLLM's
init_distributed_environment / initialize_model_parallel (adapter.parallel) and then measures checkpoint after
checkpoint (measure.ranks) until another layout is asked for. Requests and results are JSON lines; the child's own
output and vLLM's log go to a log file whose tail a failure quotes. Nothing here imports torch or vLLM in the
pytest process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import IO, Any

from quantmatrix.errors import QuantmatrixError

READY_S = 300.0  # a rank joining its world (vLLM imported already)
JOB_S = 600.0  # one checkpoint measured by every rank


class RankFailure(QuantmatrixError):
    """The rank processes could not measure a job (a rank crashed, hung or raised); the text says which and why."""


class Pool:
    """The client side, in the pytest process: a lazily started child that runs jobs rank by rank."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="quantmatrix-ranks-"))
        self._log: IO[bytes] | None = None
        self._proc: subprocess.Popen[str] | None = None
        self.jobs = 0
        self.ranks_built = 0
        self.seconds = 0.0

    @property
    def log(self) -> Path:
        return self._dir / "ranks.log"

    def run(self, job: Any) -> list[Any]:
        """measure.ranked.RankResult of every rank for `job` (a measure.ranked.Job), or RankFailure."""
        import time

        from quantmatrix.measure import ranked

        proc = self._start()
        start = time.perf_counter()
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(dataclasses.asdict(job)) + "\n")
        proc.stdin.flush()
        line = _readline(proc.stdout, READY_S + JOB_S)
        if line is None:
            self.close()
            raise RankFailure(f"the rank processes gave no answer in {READY_S + JOB_S:.0f} s{self._tail()}")
        reply = json.loads(line)
        if not reply["ok"]:
            raise RankFailure(f"{reply['error']}{self._tail()}")
        self.jobs += 1
        self.ranks_built += len(reply["ranks"])
        self.seconds += time.perf_counter() - start
        return [ranked.from_json(r) for r in reply["ranks"]]

    def _start(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            self._log = self.log.open("ab")
            self._proc = subprocess.Popen([sys.executable, "-m", "quantmatrix.measure.pool", str(self._dir)],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)
        return self._proc

    def _tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            return ""
        return "\n  rank log (" + str(self.log) + "):\n  " + "\n  ".join(lines) if lines else ""

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None


def _readline(stream: IO[str], timeout: float) -> str | None:
    """One line, or None after `timeout` seconds (the reader thread is abandoned with the child)."""
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return out[0] if out and out[0] else None


# ----------------------------------------------------------------------------- the child (python -m)


class _Group:
    """A layout's ranks, forked from the child once vLLM is imported, each in its own process."""

    def __init__(self, tp: int, ep: bool, workdir: Path) -> None:
        import multiprocessing

        self.layout = (tp, ep)
        init_file = tempfile.mktemp(prefix=f"gloo-tp{tp}{'-ep' if ep else ''}-", dir=workdir)
        self.conns, self.pids = [], []
        for rank in range(tp):
            parent, child = multiprocessing.Pipe()
            pid = os.fork()
            if pid == 0:
                parent.close()
                _rank_main(child, tp, ep, rank, init_file)
            child.close()
            self.conns.append(parent)
            self.pids.append(pid)
        self.replies(READY_S)

    def replies(self, timeout: float) -> list[Any]:
        out = []
        for rank, conn in enumerate(self.conns):
            if not conn.poll(timeout):
                raise RuntimeError(f"rank {rank} of tp{self.layout[0]} gave no answer in {timeout:.0f} s")
            try:
                status, value = conn.recv()
            except EOFError:
                raise RuntimeError(f"rank {rank} of tp{self.layout[0]} exited (see the rank log)") from None
            if status != "ok":
                raise RuntimeError(f"rank {rank} of tp{self.layout[0]}{'_ep' if self.layout[1] else ''}: {value}")
            out.append(value)
        return out

    def run(self, job: dict[str, Any]) -> list[Any]:
        for conn in self.conns:
            conn.send(job)
        return self.replies(JOB_S)

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for pid in self.pids:
            os.waitpid(pid, 0)


def _rank_main(conn: Any, tp: int, ep: bool, rank: int, init_file: str) -> None:
    """A rank process: join the world, then measure each job sent until None; never returns."""
    code = 0
    try:
        import torch

        from quantmatrix.adapter import parallel
        from quantmatrix.measure import ranked, ranks

        torch.set_num_threads(1)
        parallel.init_rank(tp, ep, rank, init_file)
        conn.send(("ok", None))
        while (job := conn.recv()) is not None:
            try:
                spec = ranked.Job(**{**job, "archs": tuple((a, tuple(c)) for a, c in job["archs"])})
                conn.send(("ok", ranked.to_json(ranks.measure(spec, rank))))
            except Exception:  # noqa: BLE001 - the job fails with its traceback; the rank serves on
                conn.send(("error", traceback.format_exc(limit=8)))
    except EOFError:
        pass  # the child went away: so do its ranks
    except BaseException:  # noqa: BLE001 - a rank that cannot start says why, then exits
        code = 1
        try:
            conn.send(("error", traceback.format_exc(limit=8)))
        except OSError:
            pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    """Serve jobs (JSON lines on stdin) with one group of ranks at a time; answer on the real stdout only."""
    import importlib

    from quantmatrix.adapter import layers

    answer = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what vLLM and the ranks print goes to the log, never into the answers
    for module in layers.MODULES:
        importlib.import_module(module)
    workdir = Path(sys.argv[1])
    group: _Group | None = None
    for line in sys.stdin:
        job = json.loads(line)
        try:
            layout = (job["tp"], job["ep"])
            if group is None or group.layout != layout:
                if group is not None:
                    group.close()
                group = None
                group = _Group(*layout, workdir)
            reply = {"ok": True, "ranks": group.run(job)}
        except Exception as e:  # noqa: BLE001 - the job's failure is the answer; the next job starts afresh
            reply = {"ok": False, "error": str(e)}
            if group is not None:
                _abandon(group)
            group = None
        answer.write(json.dumps(reply) + "\n")
    if group is not None:
        group.close()


def _abandon(group: _Group) -> None:
    """A failed group's ranks are killed (one may hang in a collective), not waited for politely."""
    import signal

    for pid in group.pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


if __name__ == "__main__":
    main()
