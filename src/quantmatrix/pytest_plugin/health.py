"""The vLLM under test, checked once per session (adapter.health) before the first case that needs it: where a
part is broken, every case needing that part fails at once with one shared message, and the rest still run.

The controller checks (xdist workers read its result from `workerinput`); a result that found vLLM working is
kept under the quantmatrix cache, keyed by this exact environment (interpreter, path, every installed
distribution's version), so that the many pytest sessions of one install pay for the child once.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import sys
from typing import Any

import pytest

from quantmatrix import properties as P
from quantmatrix.adapter.health import Health, check
from quantmatrix.adapter.versions import versions, vllm_origin
from quantmatrix.atomic import write_atomic
from quantmatrix.checkpoints.store import cache_root
from quantmatrix.pytest_plugin.settings import SESSION, SETTINGS
from quantmatrix.schema.model import Case

_WORKER_KEY = "quantmatrix_vllm_health"

# one fact, one property per case: the suite's VLLM_HEALTH record says why
BROKEN_PROPERTIES = ((P.NOT_TESTED, P.VLLM_BROKEN),)


def _env_key() -> str:
    """This interpreter, its path and every installed distribution's version: a change to any of them is a
    different vLLM under test."""
    parts = [sys.executable, os.environ.get("PYTHONPATH", ""), str(vllm_origin())]
    parts += sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _checked(timeout: float) -> Health:
    path = cache_root() / "health" / f"{_env_key()}.json"
    try:
        return Health.from_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    health = check(timeout)
    if health.ok:  # a broken result is checked again next session: the fix may be one pip install away
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, health.to_json())
    return health


def _needed(config: pytest.Config) -> bool:
    s = config.stash[SETTINGS]
    return (s.matrix is not None and any(c.vllm for c in s.matrix.checks.values())
            and versions()["vllm_distribution"] != "none")  # no vLLM at all: those cases skip, as before


def session_health(config: pytest.Config) -> Health | None:
    """The session's result, computed on first use (never during collection: `--collect-only` stays cheap)."""
    session = config.stash[SESSION]
    if "health" not in session.memo:
        workerinput = getattr(config, "workerinput", None)
        if workerinput is not None and _WORKER_KEY in workerinput:
            text = workerinput[_WORKER_KEY]
            session.memo["health"] = Health.from_json(text) if text else None
        else:
            needed = _needed(config)
            session.memo["health"] = _checked(config.stash[SETTINGS].health_timeout) if needed else None
    return session.memo["health"]


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
    health = session_health(node.config)
    node.workerinput[_WORKER_KEY] = health.to_json() if health is not None else ""


def summary_lines(config: pytest.Config) -> list[str]:
    health = config.stash[SESSION].memo.get("health")
    return health.detail() if health is not None else []


def record(config: pytest.Config) -> dict[str, str]:
    """The one `vllm_health` testsuite property (empty when no case needed vLLM)."""
    health = config.stash[SESSION].memo.get("health")
    return {P.VLLM_HEALTH: health.record()} if health is not None else {}
