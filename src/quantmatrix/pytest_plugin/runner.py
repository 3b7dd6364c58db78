"""What a GPU runner needs from a pytest run beyond the matrix: each xdist worker pinned to its own GPUs with
CUDA_VISIBLE_DEVICES (one GPU, or its own tensor-parallel group of N under --gpus-per-worker N). The time limit,
the other runner setting, is a gate (pytest_plugin.gates)."""

from __future__ import annotations

import os
import re

from quantmatrix.errors import OptionError
from quantmatrix.host.detect import VISIBLE, query_nvidia_smi
from quantmatrix.pytest_plugin.options import GPUS_PER_WORKER


def visible_gpus() -> list[str]:
    """The GPUs this process may hand out: CUDA_VISIBLE_DEVICES where set (as CUDA reads it: up to the first
    index nvidia-smi does not list), else every GPU nvidia-smi lists. A runner registered per GPU
    (CUDA_VISIBLE_DEVICES=1 in its .env) hands out that one, however many the machine has."""
    given = os.environ.get(VISIBLE)
    listed = query_nvidia_smi()
    if given is None:
        return [str(d.index) for d in listed or []]
    entries = [d.strip() for d in given.split(",") if d.strip()]
    if listed is None or not all(e.isdigit() for e in entries):
        return entries
    known, out = {d.index for d in listed}, []
    for e in entries:
        if int(e) not in known:
            break
        out.append(e)
    return out


def spread(per_worker: int) -> list[str]:
    """The pytest arguments that run one xdist worker per `per_worker` GPUs this process sees (none for a
    single worker): `quantmatrix run --spread N`, so a runner's worker count and the workers' pinning read the
    same GPUs."""
    workers = len(visible_gpus()) // per_worker
    if workers < 2:
        return []
    return ["-n", str(workers), "--dist", "loadgroup", GPUS_PER_WORKER.name, str(per_worker)]


def worker_index(worker_id: str) -> int:
    """K of xdist worker `gwK` (the id xdist hands a worker in config.workerinput["workerid"])."""
    found = re.fullmatch(r"gw(\d+)", worker_id)
    if found is None:
        raise OptionError(f"cannot read an xdist worker number from {worker_id!r} (pinning GPUs per worker)")
    return int(found.group(1))


def worker_gpus(worker_id: str | None, per_worker: int | None, gpus: list[str]) -> list[str] | None:
    """The slice of `gpus` xdist worker `worker_id` owns: its own `per_worker` (--gpus-per-worker; too few is a
    usage error), else one GPU, taken round-robin when workers outnumber GPUs. None: nothing to pin (no xdist
    worker, or no GPU without --gpus-per-worker)."""
    if worker_id is None or (per_worker is None and not gpus):
        return None
    k = worker_index(worker_id)
    if per_worker is None:
        return [gpus[k % len(gpus)]]
    mine = gpus[k * per_worker:(k + 1) * per_worker]
    if len(mine) < per_worker:
        raise OptionError(f"{GPUS_PER_WORKER.name} {per_worker}: worker {worker_id} has no {per_worker} GPUs of "
                          f"its own ({len(gpus)} visible: {','.join(gpus) or 'none'}); run with "
                          f"-n {max(1, len(gpus) // per_worker)}")
    return mine


def pin(worker_id: str | None, per_worker: int | None, workers: int | None = None) -> None:
    """On an xdist worker, before any CUDA use (host detection and the engines' children read the variable),
    restrict this process to its own GPUs. In the xdist controller (`workers` from -n), check first that the last
    worker will have GPUs of its own: one usage error, before any worker starts."""
    if worker_id is None:
        if per_worker is not None and workers:
            worker_gpus(f"gw{workers - 1}", per_worker, visible_gpus())
        return
    mine = worker_gpus(worker_id, per_worker, visible_gpus())
    if mine is not None:
        os.environ[VISIBLE] = ",".join(mine)
