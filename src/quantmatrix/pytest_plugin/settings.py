"""What the plugin resolved once (frozen Settings, pytest-timeout style) and what a pytest process caches
(Session): both live in the config's stash, and hooks and fixtures read only these."""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quantmatrix import properties as P
from quantmatrix.adapter.versions import versions
from quantmatrix.errors import QuantmatrixError
from quantmatrix.host.detect import Host
from quantmatrix.pytest_plugin import runner
from quantmatrix.pytest_plugin.options import ARCH, FLAGS, MATRIX, RUN_ID_ENV
from quantmatrix.schema.load import DEFAULT_MATRIX, load
from quantmatrix.schema.model import Case, Cell, Matrix


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything resolved once at configure time; `matrix_source` says where the matrix came from, so an error
    about it names the option, the ini key or the default that chose it."""

    matrix: Matrix | None
    matrix_source: str
    host: Host | None
    strict_hardware: bool
    strict_checkpoints: bool
    today: datetime.date
    runner: str
    health_timeout: float  # seconds the vLLM health check may take (pytest_plugin.health)
    health_child: bool  # --vllm-health-child: never check in this process
    time_limit: float | None  # --time-limit, seconds
    deadline: float | None  # time.monotonic() at which --time-limit runs out
    gpus_per_worker: int | None  # each xdist worker's own GPUs (None: one each), pinned before detection
    run_id: str  # `quantmatrix run`'s id (QUANTMATRIX_RUN_ID), "" for a plain pytest run
    update_references: bool  # this run writes the e2e references (pytest_plugin.e2e)
    compute_sanitizer: Path | None = None  # --compute-sanitizer (host.sanitizer looks further without it)

    def host_properties(self) -> list[tuple[str, str]]:
        """Per-case copies of the host facts: per-case properties survive xdist, testsuite ones do not."""
        props = list(versions().items())
        devices = self.host.devices if self.host else ()
        props += [(P.RUNNER, self.runner),
                  (P.DEVICE_NAME, ", ".join(d.name for d in devices)),
                  (P.DEVICE_CAPABILITY, ", ".join(f"{d.capability[0]}.{d.capability[1]}" for d in devices))]
        return props


@dataclasses.dataclass
class Session:
    """One pytest process's caches: a result per key (a cell's arch and mode multiply the cases, not the work),
    and how many MoE layers were built (the closing figure: builds vs cases)."""

    memo: dict[tuple[str, Any], Any] = dataclasses.field(default_factory=dict)
    layer_builds: int = 0
    # axis marks per marker combination: building thousands of identical ones dominates collection
    marks: dict[tuple[str, ...], tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    pool: Any = None  # measure.pool.Pool: the rank processes, started by the first case of a multi-rank layout

    def once(self, key: tuple[str, Any], compute: Callable[[], Any]) -> Any:
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def rank_pool(self) -> Any:
        if self.pool is None:
            from quantmatrix.measure.pool import Pool

            self.pool = Pool()
        return self.pool

    def close(self) -> None:
        """Stop the rank processes (at the end of the session)."""
        if self.pool is not None:
            self.pool.close()


SETTINGS = pytest.StashKey[Settings]()
SESSION = pytest.StashKey[Session]()


def _matrix_path(config: pytest.Config, option: str | None) -> tuple[Path | None, str]:
    """(path, how it was chosen): --matrix is relative to the working directory, the ini value to the rootdir."""
    ini = config.getini("quantmatrix_matrix")
    if option or ini:
        source = f"{MATRIX.name} {option}" if option else f"ini option quantmatrix_matrix = {ini}"
        path = Path(option or ini)
        if not path.is_absolute():
            path = (Path.cwd() if option else config.rootpath) / path
        if not path.is_file():
            raise pytest.UsageError(f"{source}: no such file ({path})")
        return path, source
    default = config.rootpath / DEFAULT_MATRIX
    return (default, f"the default matrix {DEFAULT_MATRIX}") if default.is_file() else (None, "no matrix")


def _host(config: pytest.Config, matrix: Matrix, arch: str | None) -> Host:
    """The first answer of the pytest_quantmatrix_host hook: a runner's conftest, else host.detect's chain."""
    host = config.hook.pytest_quantmatrix_host(config=config, matrix=matrix, arch=arch)
    if not isinstance(host, Host):
        raise pytest.UsageError(f"pytest_quantmatrix_host answered {host!r}, not a quantmatrix.host.detect.Host")
    return host


def resolve(config: pytest.Config) -> Settings:
    """Every option, the ini key and the environment, read once (pytest-timeout's get_env_settings). An xdist
    worker is pinned to its GPUs before the host is detected, so that detection sees only the worker's own."""
    opt = {flag.dest: config.getoption(flag.dest) for flag in FLAGS}
    worker = (getattr(config, "workerinput", None) or {}).get("workerid")  # xdist's id of this worker
    try:
        runner.pin(worker, opt["gpus_per_worker"], config.getoption("numprocesses", None))
    except QuantmatrixError as e:
        raise pytest.UsageError(str(e)) from None
    path, source = _matrix_path(config, opt["matrix"])
    matrix = host = None
    if path is not None:
        try:
            matrix = load(path, opt["trust_matrix"])
            host = _host(config, matrix, opt["arch"])
        except QuantmatrixError as e:
            raise pytest.UsageError(f"{e} (matrix from {source})") from None
    elif opt["arch"]:
        raise pytest.UsageError(f"{ARCH.name} needs a matrix: pass {MATRIX.name} FILE or create {DEFAULT_MATRIX}")
    limit = opt["time_limit"]
    return Settings(
        matrix=matrix, matrix_source=source, host=host, strict_hardware=opt["strict_hardware"],
        strict_checkpoints=opt["strict_checkpoints"], today=datetime.date.today(),
        runner=os.environ.get("RUNNER_NAME") or socket.gethostname(), health_timeout=opt["vllm_health_timeout"],
        health_child=opt["vllm_health_child"],
        time_limit=limit, deadline=None if limit is None else time.monotonic() + limit,
        gpus_per_worker=opt["gpus_per_worker"], run_id=os.environ.get(RUN_ID_ENV, ""),
        update_references=opt["update_references"], compute_sanitizer=opt["compute_sanitizer"])


def case_of(item: pytest.Item) -> Case | None:
    """The item's matrix case (not the placeholder pytest puts in an empty parametrization)."""
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("case") if callspec is not None else None
    return case if isinstance(case, Case) else None


def xdist_group(cell: Cell) -> str:
    """The cell as an xdist_group name: `--dist loadgroup` takes the text after the last '@' of a node id, so the
    name must hold none (a cell id does: checkpoint@arch-mode)."""
    return cell.id.replace("@", "/")
