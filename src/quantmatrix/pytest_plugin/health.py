"""The vLLM under test, checked once per session (adapter.health) before the first case that needs it: where a
part is broken, every case needing that part fails at once with one shared message, and the rest still run.

Where this process runs the cases itself, the check imports vLLM here (adapter.health.check_here): the cases
import it next anyway, so a cold start pays for the import once. An xdist controller, which imports no vLLM of its
own, asks a child and hands every worker the result through `workerinput`; so does a process whose earlier
in-process check under this environment never finished (it crashed or was killed: the marker it left says so),
and --vllm-health-child asks for the child always. A result that found vLLM working is kept under the
quantmatrix cache, keyed by this environment (interpreter, path, every installed distribution's
version, vLLM's native libraries, the driver, the CUDA/vLLM/loader environment variables), so that the many pytest
sessions of one install pay for the child once. A key cannot see everything that breaks an import, so a cached
"ok" is trusted only until a case meets an import error it did not predict: then the cache entry is dropped, the
check runs again, and the rest of the session fails fast with the one shared cause.

Where vLLM is not installed at all, its cases skip (a CPU host for the report or the lint), except under
--strict-hardware: a GPU runner without vLLM fails every case that needs it with that one cause.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

from quantmatrix import properties as P
from quantmatrix.adapter.health import Health, absent, check, check_here
from quantmatrix.adapter.versions import vllm_origin
from quantmatrix.atomic import write_atomic
from quantmatrix.checkpoints.store import cache_root
from quantmatrix.pytest_plugin.settings import SESSION, SETTINGS, case_of
from quantmatrix.schema.model import Case

_WORKER_KEY = "quantmatrix_vllm_health"

# one fact, one property per case: the suite's VLLM_HEALTH record says why
BROKEN_PROPERTIES = ((P.NOT_TESTED, P.VLLM_BROKEN),)


# the environment variables that change what an import of vLLM loads
_ENV_PREFIXES = ("VLLM_", "CUDA_", "TORCH_", "PYTORCH_", "NCCL_", "LD_", "FLASHINFER_")


def _native(origin: str | None) -> list[str]:
    """Size and mtime of vLLM's own compiled libraries: one replaced in place is a different vLLM."""
    if origin is None:
        return []
    root = Path(origin).parent
    return sorted(f"{f.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}" for f in root.glob("**/*.so")
                  if (st := f.stat()))


def _driver() -> str:
    try:
        return Path("/proc/driver/nvidia/version").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _env_key() -> str:
    """This interpreter, its path, every installed distribution's version, vLLM's native libraries, the driver
    and the environment variables that steer an import: a change to any of them is a different vLLM under test."""
    origin = vllm_origin()
    parts = [sys.executable, os.environ.get("PYTHONPATH", ""), str(origin), _driver(), *_native(origin)]
    parts += sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES))
    parts += sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _cache_path() -> Path:
    return cache_root() / "health" / f"{_env_key()}.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _crashed_here(path: Path) -> bool:
    """An in-process check under this environment began and never finished: its process is gone (a crash)."""
    pids = [m.suffix[1:] for m in path.parent.glob(f"{path.stem}.here.*")]
    return any(not _alive(int(pid)) for pid in pids if pid.isdigit())


def _check_here(path: Path, timeout: float) -> Health:
    """The check in this process, marked for the next session while it runs: an import that kills the process
    leaves the marker, and every later session under this environment asks a child, which survives it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    marker = path.with_name(f"{path.stem}.here.{os.getpid()}")
    marker.touch()
    health = check_here(timeout)
    marker.unlink()
    return health


def _checked(timeout: float, memo: dict[Any, Any], here: bool = False) -> Health:
    path = _cache_path()
    try:
        health = Health.from_json(path.read_text(encoding="utf-8"))
        memo["health_cached"] = path
        return health
    except (OSError, ValueError, KeyError, TypeError):
        pass
    health = _check_here(path, timeout) if here and not _crashed_here(path) else check(timeout)
    if health.ok:  # a broken result is checked again next session: the fix may be one pip install away
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, health.to_json())
        for marker in path.parent.glob(f"{path.stem}.here.*"):  # a crash that no longer happens
            marker.unlink(missing_ok=True)
    return health


def _needed(config: pytest.Config) -> bool:
    s = config.stash[SETTINGS]
    return s.matrix is not None and any(c.vllm for c in s.matrix.checks.values())


def _fresh(config: pytest.Config, here: bool) -> Health | None:
    """The controller's own check: absent vLLM (None: its cases skip, or all broken under --strict-hardware),
    else the cached or freshly measured verdict (in this process where `here`, unless --vllm-health-child)."""
    s, memo = config.stash[SETTINGS], config.stash[SESSION].memo
    if not _needed(config):
        return None
    if vllm_origin() is None:
        return absent() if s.strict_hardware else None
    return _checked(s.health_timeout, memo, here and not s.health_child)


def session_health(config: pytest.Config, here: bool = True) -> Health | None:
    """The session's result, computed on first use (never during collection: `--collect-only` stays cheap);
    `here`: this process runs the cases (an xdist controller does not)."""
    session = config.stash[SESSION]
    if "health" not in session.memo:
        workerinput = getattr(config, "workerinput", None)
        if workerinput is not None and _WORKER_KEY in workerinput:
            text = workerinput[_WORKER_KEY]
            session.memo["health"] = Health.from_json(text) if text else None
        else:
            session.memo["health"] = _fresh(config, here)
    return session.memo["health"]


def _import_failure(excinfo: pytest.ExceptionInfo[BaseException]) -> bool:
    """The error came out of an import: an ImportError, or anything raised while a module was executing, itself
    or as the cause of what the case raised (the adapter names an import it cannot make as an AdapterMismatch)."""
    error: BaseException | None = excinfo.value
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ImportError) or any(
                f.filename.startswith("<frozen importlib") for f in traceback.extract_tb(error.__traceback__)):
            return True
        error = error.__cause__ or error.__context__
    return False


def unpredicted(config: pytest.Config, case: Case, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    """A case that needs vLLM met an import error although the check said vLLM works: the "ok" was stale (an
    environment change the cache key cannot see). Drop the cached verdict, check again (once per process), and let
    the gate fail the rest of the session with the new shared cause."""
    memo = config.stash[SESSION].memo
    health = memo.get("health")
    if not case.check.vllm or health is None or not health.ok or memo.get("health_rechecked") \
            or not _import_failure(excinfo):
        return
    memo["health_rechecked"] = True
    with contextlib.suppress(OSError):
        (memo.get("health_cached") or _cache_path()).unlink()
    memo["health"] = _checked(config.stash[SETTINGS].health_timeout, {})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Watch every failing call of a vLLM case for an import error the health check did not predict."""
    yield
    case = case_of(item)
    if call.excinfo is not None and case is not None and call.when in ("setup", "call"):
        unpredicted(item.config, case, call.excinfo)


def broken(config: pytest.Config, case: Case) -> str | None:
    """The one shared message when a part of vLLM the case needs is broken (the gate in pytest_plugin.gates
    fails the case with it, before any fixture, recording BROKEN_PROPERTIES); None when it is not."""
    if not case.check.vllm:
        return None
    health = session_health(config)
    return health.message(case.check.vllm) if health is not None else None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: check once here, and hand every worker the result."""
    health = session_health(node.config, here=False)
    node.workerinput[_WORKER_KEY] = health.to_json() if health is not None else ""


def summary_lines(config: pytest.Config) -> list[str]:
    health = config.stash[SESSION].memo.get("health")
    return health.detail() if health is not None else []


def record(config: pytest.Config) -> dict[str, str]:
    """The one `vllm_health` testsuite property (empty when no case needed vLLM)."""
    health = config.stash[SESSION].memo.get("health")
    return {P.VLLM_HEALTH: health.record()} if health is not None else {}
