"""A sanitized engine run read from disk: each process's compute-sanitizer log (`sanitizer.<pid>.log`, the runner's
--log-file) mapped through the parameter record of the engine worker with that pid (the run's result). Also the
inputs `quantmatrix initcheck` takes by hand: a run directory, or one log with its record in a file or in a
`PARAMS {json}` line of the log itself.

Which process wrote a log is read from its name, and only trusted where it is one of the workers' pids: NVIDIA's
manual gives `%p` as compute-sanitizer's own pid on some releases, and then every followed process writes into one
log whose name matches no worker. Such a log is mapped through the one worker that held the model; with several,
no address can be placed in a process (a virtual address means different memory in each), and that is said.

What cannot be read (a log cut short, no log for the process that held the model, a malformed record) is kept as
text (`unreadable`), for the check to say; nothing here judges.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from quantmatrix import bounded
from quantmatrix.engine.protocol import SANITIZER_LOG
from quantmatrix.errors import SanitizerLogError
from quantmatrix.measure import initcheck
from quantmatrix.measure.uninit import Hit, Record, Uninit, from_params_line, map_reports, worker_record

BY_PID = "one log per process, by its pid"
_LOG_PID = re.compile(re.escape(SANITIZER_LOG).replace("%p", r"(\d+)"))


@dataclasses.dataclass(frozen=True)
class Sanitized:
    """Every process's mapped report, and what could not be read (`unreadable`); `recorded`: tensors in the
    records the engine's workers returned."""

    processes: tuple[Uninit, ...]
    unreadable: tuple[str, ...]
    recorded: int
    attribution: str = BY_PID  # how each log was matched to a worker's record

    @property
    def hits(self) -> list[Hit]:
        return [h for p in self.processes for h in p.hits]

    @property
    def other(self) -> dict[str, int]:
        total: collections.Counter[str] = collections.Counter()
        for p in self.processes:
            total.update(p.other)
        return dict(total.most_common())

    @property
    def reports(self) -> int:
        return sum(p.reports for p in self.processes)

    @property
    def withheld(self) -> int:
        """Reports counted in a summary but never printed: reads nobody can place."""
        return sum(p.withheld for p in self.processes)

    @property
    def ordered(self) -> bool:
        """Whether every process that held tensors had its report split by the marker."""
        held = [p for p in self.processes if p.tensors]
        return bool(held) and all(p.marker_at is not None for p in held)


def log_pid(path: Path) -> int | None:
    m = _LOG_PID.fullmatch(path.name)
    return int(m[1]) if m else None


def of_run(logs: list[Path], workers: list[dict[str, Any]]) -> Sanitized:
    """Each log through the record of the worker with its pid; a process with no record (the engine child, a
    process without the model) has every read counted as scratch/activation memory."""
    unreadable: list[str] = []
    records: dict[int | None, Record] = {}
    for i, w in enumerate(workers):
        try:
            rec = worker_record(w.get("params"), f"worker {i} (pid {w.get('pid')}) parameter record")
        except SanitizerLogError as e:
            unreadable.append(str(e))
            continue
        records[w.get("pid") if type(w.get("pid")) is int else rec.pid] = rec
    if not logs:
        unreadable.append(f"compute-sanitizer wrote no log ({SANITIZER_LOG}) in the run directory: it did not run")
    attribution, unplaced, record_of = _attribute(logs, records)
    unreadable += unplaced
    mapped = []
    for path in logs:
        try:
            log = initcheck.read(path)
        except SanitizerLogError as e:
            unreadable.append(str(e))
            continue
        pid = log_pid(path)
        mapped.append(map_reports(log, record_of.get(pid, Record((), None, pid))))
    return Sanitized(tuple(mapped), tuple(unreadable), sum(len(r.tensors) for r in records.values()), attribution)


def _attribute(logs: list[Path], records: dict[int | None, Record]) -> tuple[str, list[str], dict[int | None, Record]]:
    """How logs go with records (the attribution said, what cannot be placed, each log pid's record): by pid where a
    log's name is a model-holding worker's pid; else (the sanitizer named its one log by its own pid) that log
    through the one worker that held the model; else no read can be placed in a process."""
    holders = {pid: r for pid, r in records.items() if r.tensors}
    seen = {log_pid(p) for p in logs}
    if not logs or not holders or seen & holders.keys():
        return BY_PID, [f"no compute-sanitizer log for engine worker pid {pid}, the process that held the model: "
                        "the sanitizer did not follow it (pass --target-processes all)"
                        for pid in holders if pid not in seen], records
    names = ", ".join(p.name for p in logs)
    if len(logs) == 1 and len(holders) == 1:
        (pid, only), = holders.items()
        said = (f"{names} is named by no worker's pid (compute-sanitizer's own: one log for every process it "
                f"followed), mapped through the one worker that held the model, pid {pid}")
        return said, [], {log_pid(logs[0]): only}
    return "none", [f"the logs' names ({names}) give no pid of the {len(holders)} engine workers that held the model "
                    f"(pids {', '.join(map(str, holders))}), so no read can be placed in a process"], {}


def _json(path: Path) -> Any:
    """A result or record file through bounded's reader (a regular file under the result cap)."""
    try:
        return json.loads(bounded.read_text(path, "result"))
    except bounded.InputError as e:
        raise SanitizerLogError(f"{path}: not a readable JSON file ({e.why})") from None
    except (ValueError, RecursionError) as e:
        raise SanitizerLogError(f"{path}: not a readable JSON file ({type(e).__name__}: {str(e)[:200]})") from None


def run_directory(directory: Path) -> Sanitized:
    """A run directory of the engine store (<cache>/e2e/<session>/<cell>-<digest>/): result.json and its logs."""
    result = _json(directory / "result.json")
    workers = result.get("workers") if isinstance(result, dict) else None
    if not isinstance(workers, list):
        raise SanitizerLogError(f"{directory / 'result.json'}: holds no engine workers (the run failed before "
                                "the model was inspected; its engine.log says why)")
    return of_run(sorted(directory.glob(SANITIZER_LOG.replace("%p", "*"))), workers)


def one_log(log_path: Path, params: Path | None) -> Sanitized:
    """One log with its record: `params` (a run's result.json, one worker's record, or a PARAMS object), else the
    log's own PARAMS lines. An input that names no record is an error, not a run without parameters."""
    log = initcheck.read(log_path)
    if params is None:
        if not log.params:
            raise SanitizerLogError(f"{log_path}: no parameter record: the log has no `PARAMS {{json}}` line; pass "
                                    "--params FILE (the run's result.json) or the run's directory")
        merged = {k: v for p in log.params for k, v in p.items()}
        record = Record(tuple(from_params_line(merged, f"{log_path} PARAMS")), None)
    else:
        record = _record_file(params, log_pid(log_path))
    given = "its own PARAMS lines" if params is None else str(params)
    return Sanitized((map_reports(log, record),), (), len(record.tensors), f"one log, {log_path.name}, with {given}")


def _record_file(path: Path, pid: int | None) -> Record:
    data = _json(path)
    if isinstance(data, dict) and isinstance(data.get("workers"), list):
        workers = data["workers"]
        match = [w for w in workers if isinstance(w, dict) and w.get("pid") == pid]
        if not match and len(workers) == 1:
            match = workers
        if len(match) != 1:
            raise SanitizerLogError(f"{path}: {len(workers)} engine workers and the log's name gives no pid of "
                                    f"theirs ({SANITIZER_LOG}): pass the log of one worker")
        data = match[0]
    if isinstance(data, dict) and isinstance(data.get("params"), dict):
        data = data["params"]
    if isinstance(data, dict) and "records" in data:
        return worker_record(data, str(path))
    if isinstance(data, dict):
        return Record(tuple(from_params_line(data, str(path))), None)
    raise SanitizerLogError(f"{path}: neither a run's result.json, a parameter record nor a PARAMS object")
