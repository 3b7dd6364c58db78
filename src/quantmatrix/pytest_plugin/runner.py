"""What a GPU runner needs from a pytest run beyond the matrix: one xdist worker per GPU (or per tensor-parallel
group) pinned with CUDA_VISIBLE_DEVICES, and a time limit for the run that still ends in a JUnit file, with every
case it did not reach skipped as "not run" (so the report counts it as untested, never as passed)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import pytest

from quantmatrix.host.detect import query_nvidia_smi

VISIBLE = "CUDA_VISIBLE_DEVICES"
_DEADLINE = pytest.StashKey[float]()


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise pytest.UsageError(f"--gpus-per-worker needs a whole number of GPUs >= 1, not {value!r}")
    return int(value)


def positive_seconds(flag: str) -> Callable[[str], float]:
    """An option type that names its flag when the value is not a positive number of seconds."""
    def parse(value: str) -> float:
        try:
            seconds = float(value)
        except ValueError:
            seconds = 0.0
        if not seconds > 0:
            raise pytest.UsageError(f"{flag} needs a positive number of seconds, not {value!r}")
        return seconds
    return parse


def add_options(group: pytest.OptionGroup) -> None:
    group.addoption("--gpus-per-worker", type=_positive_int, default=None, metavar="N",
                    help="under pytest-xdist, pin each worker to its own N GPUs with CUDA_VISIBLE_DEVICES "
                         "(worker gwK gets GPUs K*N .. K*N+N-1 of those visible); run with -n <GPUs / N>")
    group.addoption("--time-limit", type=positive_seconds("--time-limit"), default=None, metavar="S",
                    help="after S seconds, skip every case not yet started as 'not run' (the JUnit file is "
                         "still written; the report counts those cases as untested)")


def visible_gpus() -> list[str]:
    """The GPUs this process may hand out: CUDA_VISIBLE_DEVICES where set, else every GPU nvidia-smi lists."""
    given = os.environ.get(VISIBLE)
    if given is not None:
        return [d.strip() for d in given.split(",") if d.strip()]
    return [str(d.index) for d in query_nvidia_smi() or []]


def worker_gpus(worker_id: str, per_worker: int, gpus: list[str]) -> list[str]:
    """The slice of `gpus` that xdist worker `worker_id` (gw0, gw1, ...) owns."""
    found = re.fullmatch(r"gw(\d+)", worker_id)
    if found is None:
        raise pytest.UsageError(f"--gpus-per-worker: cannot read an xdist worker number from {worker_id!r}")
    k = int(found.group(1))
    mine = gpus[k * per_worker:(k + 1) * per_worker]
    if len(mine) < per_worker:
        raise pytest.UsageError(f"--gpus-per-worker {per_worker}: worker {worker_id} has no {per_worker} GPUs of "
                                f"its own ({len(gpus)} visible: {','.join(gpus) or 'none'}); run with "
                                f"-n {max(1, len(gpus) // per_worker)}")
    return mine


def pin_worker(config: pytest.Config) -> None:
    """On an xdist worker, before any CUDA use (host detection and the engines' children read this variable),
    restrict the worker to its own GPUs."""
    per_worker = config.getoption("gpus_per_worker")
    workerinput = getattr(config, "workerinput", None)
    if per_worker is None or workerinput is None:
        return
    os.environ[VISIBLE] = ",".join(worker_gpus(workerinput["workerid"], per_worker, visible_gpus()))


def start_clock(config: pytest.Config) -> None:
    limit = config.getoption("time_limit")
    if limit is not None:
        config.stash[_DEADLINE] = time.monotonic() + limit


def not_reached(config: pytest.Config) -> str | None:
    """Why a case must not start: the run's time limit has passed."""
    deadline = config.stash.get(_DEADLINE, None)
    if deadline is None or time.monotonic() < deadline:
        return None
    return (f"not run: the time limit of {config.getoption('time_limit'):g} s for this run (--time-limit) "
            "passed before this case started")
