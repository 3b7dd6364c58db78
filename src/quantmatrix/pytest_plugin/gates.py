"""Why a case must not run, asked before any fixture builds anything: pytest_runtest_setup walks GATES in order
and stops at the first answer. Each gate is a small function of the config (its Settings in the stash) and the
case, returning None or a Stop (skip or fail, with the reason). The fixtures ask the same questions through the
same functions (too_few_gpus, strict), so each reason is written once."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import time
from collections.abc import Callable
from typing import NoReturn

import pytest

from quantmatrix.adapter.versions import engine_needs_gpu, engine_platform
from quantmatrix.host import cpu, sanitizer
from quantmatrix.pytest_plugin import health
from quantmatrix.pytest_plugin.options import STRICT_HARDWARE, TIME_LIMIT
from quantmatrix.pytest_plugin.settings import SETTINGS, Settings
from quantmatrix.schema.factory import PRODUCERS
from quantmatrix.schema.model import Case, Cell


@dataclasses.dataclass(frozen=True)
class Stop:
    """What to do instead of running a case: skip it, or fail it, for `reason` (and record `properties`)."""

    reason: str
    fail: bool = False
    properties: tuple[tuple[str, str], ...] = ()

    def now(self) -> NoReturn:
        if self.fail:
            pytest.fail(self.reason, pytrace=False)
        pytest.skip(self.reason)


def strict(flag: str, on: bool, reason: str) -> Stop:
    """Skip for `reason`, or fail naming `flag` where the run asked for a missing resource to be an error (a
    runner that is supposed to have that GPU, that checkpoint)."""
    return Stop(f"{flag}: {reason}", fail=True) if on else Stop(reason)


def too_few_gpus(settings: Settings, cell: Cell) -> str | None:
    """Why this host cannot serve the cell's checkpoint (fewer GPUs of the arch than it needs), or None."""
    ck, host = cell.checkpoint, settings.host
    if host is None or not host.has(cell.arch) or host.count(cell.arch) >= ck.gpus:
        return None
    return f"{ck.id} needs {ck.gpus} GPUs of {cell.arch.describe()}; this host has {host.count(cell.arch)}"


Gate = Callable[[pytest.Config, Case], Stop | None]


def time_limit(config: pytest.Config, case: Case) -> Stop | None:
    """The run's --time-limit has passed: the case is "not run" (the report counts it as untested)."""
    s = config.stash[SETTINGS]
    if s.deadline is None or time.monotonic() < s.deadline:
        return None
    return Stop(f"not run: the time limit of {s.time_limit:g} s for this run ({TIME_LIMIT.name}) passed before "
                "this case started")


def expired_waiver(config: pytest.Config, case: Case) -> Stop | None:
    """A waiver past its expiry hides nothing: its cases fail until the cell is fixed or the waiver renewed."""
    w = case.waiver
    if w is None or not w.expired(config.stash[SETTINGS].today):
        return None
    return Stop(f"waiver expired on {w.expires} ({w.where}): {w.reason} ({w.link}); fix the cell or renew the waiver",
                fail=True)


def arch_absent(config: pytest.Config, case: Case) -> Stop | None:
    """A gpu-tier case whose arch this host lacks (a failure under --strict-hardware)."""
    s, c = config.stash[SETTINGS], case.cell
    if case.check.tier != "gpu" or s.host is None or s.host.has(c.arch):
        return None
    return strict(STRICT_HARDWARE.name, s.strict_hardware,
                  f"needs {c.arch.describe()}; this host: {s.host.describe(s.matrix)}")


def sanitizer_absent(config: pytest.Config, case: Case) -> Stop | None:
    """An engine check in a mode that runs the engine under compute-sanitizer, on a host without one (a failure
    under --strict-hardware: a runner that is supposed to sanitize)."""
    s, mode = config.stash[SETTINGS], case.cell.mode
    if mode.sanitizer is None or "engine" not in case.check.vllm or sanitizer.find(s.compute_sanitizer):
        return None
    why = sanitizer.missing(s.compute_sanitizer)
    return strict(STRICT_HARDWARE.name, s.strict_hardware,
                  f"mode {mode.name} runs the engine under compute-sanitizer ({mode.sanitizer.tool}); {why}")


def engine_build(config: pytest.Config, case: Case) -> Stop | None:
    """A cpu-tier engine check on a host without a GPU needs vLLM's CPU build."""
    s = config.stash[SETTINGS]
    if "engine" in case.check.vllm and case.check.tier == "cpu" and s.host is not None and not s.host.devices \
            and (needs_gpu := engine_needs_gpu()):
        return Stop(f"{needs_gpu}; this host: {s.host.describe(s.matrix)}")
    return None


def host_needs(config: pytest.Config, case: Case) -> Stop | None:
    """A cpu cell that states what host it needs (`cpu_cells[].needs`: a quantized MoE whose only CPU kernels need
    zentorch or AMX), on vLLM's CPU build on a host without it: skipped naming what it lacks, as a missing GPU is
    (a failure under --strict-hardware: a runner that is supposed to have it)."""
    needs = case.check.host_needs(case.cell)
    if not needs or engine_platform() != "cpu" or not (lacking := cpu.missing(needs)):
        return None
    s = config.stash[SETTINGS]
    return strict(STRICT_HARDWARE.name, s.strict_hardware,
                  f"needs {', '.join(needs)} to run on vLLM's CPU build ({'; '.join(lacking)}); this host: "
                  f"{cpu.this_host().describe()}")


def engine_gpus(config: pytest.Config, case: Case) -> Stop | None:
    """An engine start needs every GPU of its checkpoint (config and file checks need one)."""
    short = too_few_gpus(config.stash[SETTINGS], case.cell) if "engine" in case.check.vllm else None
    return Stop(short) if short else None


def producer_packages(config: pytest.Config, case: Case) -> Stop | None:
    """A synthetic checkpoint whose producer builds with a package this environment lacks (compressed-tensors,
    which vLLM brings): one clear failure naming it, never a traceback per case."""
    ck = case.cell.checkpoint
    if ck.source.kind != "synthetic":
        return None
    missing = [p for p in PRODUCERS[ck.producer].packages if importlib.util.find_spec(p.replace("-", "_")) is None]
    if not missing:
        return None
    return Stop(f"the {ck.producer} producer builds {ck.id} with the Python package {', '.join(missing)}, which is "
                f"not installed in {sys.executable} (vLLM brings it; or pip install {' '.join(missing)})", fail=True)


def vllm_broken(config: pytest.Config, case: Case) -> Stop | None:
    """A part of the vLLM under test that the case needs does not import: one shared failure (pytest_plugin.health)."""
    message = health.broken(config, case)
    return Stop(message, fail=True, properties=health.BROKEN_PROPERTIES) if message else None


GATES: tuple[Gate, ...] = (time_limit, expired_waiver, arch_absent, sanitizer_absent, engine_build, host_needs,
                           engine_gpus, vllm_broken, producer_packages)


def first_stop(config: pytest.Config, case: Case) -> Stop | None:
    """The first gate's answer, in order; None: the case runs."""
    for gate in GATES:
        stop = gate(config, case)
        if stop is not None:
            return stop
    return None
