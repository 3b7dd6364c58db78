"""pytest hooks (entry point `pytest11: quantmatrix`): load the matrix once, register its markers, parametrize
suites' checks over its cells, gate gpu-tier cases on this host's hardware, and stamp every case with what it
ran on. The fixtures live in pytest_plugin.fixtures, registered from here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from quantmatrix.adapter.versions import engine_needs_gpu, versions
from quantmatrix.pytest_plugin import fixtures, health, runner
from quantmatrix.pytest_plugin.junit import stamp_testsuite_properties
from quantmatrix.pytest_plugin.settings import (
    DEFAULT_MATRIX,
    MATRIX_HELP,
    SESSION,
    SETTINGS,
    Session,
    case_of,
    resolve,
)
from quantmatrix.schema.model import Case
from quantmatrix.schema.yamldoc import closest


def _arch_option(value: str) -> str:
    if not value.strip():
        raise pytest.UsageError("--arch needs a name from the matrix, e.g. --arch sm120 or --arch gb10")
    return value.strip()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("quantmatrix", "quantized MoE regression matrix")
    group.addoption("--matrix", default=None, metavar="FILE", help=MATRIX_HELP)
    group.addoption("--arch", type=_arch_option, default=None, metavar="NAME",
                    help="treat this host as arch NAME (name or alias) instead of detecting its GPUs")
    group.addoption("--strict-hardware", action="store_true", default=False,
                    help="fail, instead of skip, gpu-tier cases whose arch this host lacks "
                         "(for a runner that is supposed to have that GPU)")
    group.addoption("--strict-checkpoints", action="store_true", default=False,
                    help="fail, instead of skip, cases whose hub checkpoint is not in the local HF cache "
                         "(for a runner that is supposed to hold them: see `quantmatrix fetch`)")
    group.addoption("--vllm-health-timeout", type=runner.positive_seconds("--vllm-health-timeout"),
                    default=120.0, metavar="S",
                    help="time limit of the one-per-session check that the vLLM under test imports (default 120)")
    runner.add_options(group)
    parser.addini("quantmatrix_matrix", MATRIX_HELP, default=None)


def pytest_configure(config: pytest.Config) -> None:
    runner.pin_worker(config)  # before detection: the worker sees only its own GPUs
    runner.start_clock(config)
    settings = resolve(config)
    if settings.matrix is not None:
        for name, help_line in settings.matrix.markers().items():
            config.addinivalue_line("markers", f"{name}: {help_line}")
    config.stash[SETTINGS] = settings
    config.stash[SESSION] = Session()
    config.pluginmanager.register(fixtures, "quantmatrix_fixtures")
    config.pluginmanager.register(health, "quantmatrix_health")


def pytest_report_header(config: pytest.Config) -> list[str]:
    s = config.stash[SETTINGS]
    if s.matrix is None:
        return []
    v = versions()
    return [f"quantmatrix: matrix {s.matrix.path} ({len(s.matrix.cells())} cells, from {s.matrix_source})",
            f"quantmatrix: host {s.host.describe(s.matrix) if s.host else '?'}; runner {s.runner}",
            f"quantmatrix: vllm {v['vllm_version']} ({v['vllm_distribution']}), torch {v['torch_version']}, "
            f"{v['platform']}"]


def _marks(session: Session, case: Case, today: Any) -> tuple[pytest.MarkDecorator, ...]:
    names = case.markers
    marks = session.marks.get(names)
    if marks is None:
        marks = session.marks[names] = tuple(getattr(pytest.mark, n) for n in names)
    w = case.waiver
    if w is not None and not w.expired(today):
        marks += (pytest.mark.xfail(reason=f"waived until {w.expires}: {w.reason} ({w.link})", strict=False),)
    return marks


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" not in metafunc.fixturenames:
        return
    s = metafunc.config.stash[SETTINGS]
    where = metafunc.definition.nodeid
    if s.matrix is None:
        raise pytest.UsageError(f"{where} is a matrix check but no matrix was found: pass --matrix FILE "
                                f"or create {DEFAULT_MATRIX} under the rootdir")
    name = metafunc.function.__name__.removeprefix("test_")
    check = s.matrix.checks.get(name)
    if check is None:
        raise pytest.UsageError(f"{where}: matrix {s.matrix.path} ({s.matrix_source}) has no check {name!r}"
                                f"{closest(name, s.matrix.checks)}; add it under `checks:` or rename the test")
    session = metafunc.config.stash[SESSION]
    metafunc.parametrize("case", [pytest.param(case, id=case.cell.id, marks=_marks(session, case, s.today))
                                  for case in s.matrix.cases(check)])


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture: a case that must not run (absent GPU, expired waiver) never builds anything."""
    case = case_of(item)
    if case is None:
        return
    late = runner.not_reached(item.config)
    if late:
        pytest.skip(late)
    s = item.config.stash[SETTINGS]
    c = case.cell
    item.user_properties += [
        ("checkpoint", c.checkpoint.id), ("scheme", c.checkpoint.scheme.name),
        ("producer", c.checkpoint.producer), ("arch", c.arch.name), ("mode", c.mode.name),
        ("check", case.check.name), ("kind", case.check.kind), ("tier", case.check.tier), ("cell", c.id),
        *s.host_properties(),
    ]
    w = case.waiver
    if w is not None:
        item.user_properties += [("waiver_reason", w.reason), ("waiver_link", w.link),
                                 ("waiver_expires", str(w.expires)),
                                 ("waiver_expired", str(w.expired(s.today)).lower())]
        if w.expired(s.today):
            pytest.fail(f"waiver expired on {w.expires} ({w.where}): {w.reason} ({w.link}); fix the cell or "
                        "renew the waiver", pytrace=False)
    if case.check.tier == "gpu" and s.host is not None and not s.host.has(c.arch):
        reason = f"needs {c.arch.describe()}; this host: {s.host.describe(s.matrix)}"
        if s.strict_hardware:
            pytest.fail(f"--strict-hardware: {reason}", pytrace=False)
        pytest.skip(reason)
    if "engine" in case.check.vllm and case.check.tier == "cpu" and s.host is not None and not s.host.devices \
            and (needs_gpu := engine_needs_gpu()):
        pytest.skip(f"{needs_gpu}; this host: {s.host.describe(s.matrix)}")
    if "engine" in case.check.vllm and s.host is not None and s.host.has(c.arch) and \
            s.host.count(c.arch) < c.checkpoint.gpus:  # an engine start; config and file checks need one GPU
        pytest.skip(f"{c.checkpoint.id} needs {c.checkpoint.gpus} GPUs of {c.arch.describe()}; this host has "
                    f"{s.host.count(c.arch)}")
    health.gate(item, case)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stamp host-level properties into the JUnit file once, from the controller, after pytest wrote it
    (record_testsuite_property is lost under xdist)."""
    config = session.config
    xml = getattr(config.option, "xmlpath", None)
    s = config.stash.get(SETTINGS, None)
    if not xml or hasattr(config, "workerinput") or s is None or s.matrix is None or not Path(xml).is_file():
        return
    archs = s.host.archs(s.matrix) if s.host else []
    stamp_testsuite_properties(Path(xml), {**dict(s.host_properties()), "matrix": str(s.matrix.path),
                                           "time_limit_s": str(config.getoption("time_limit") or ""),
                                           "host_arch": " ".join(a.name for a in archs),
                                           "run_id": os.environ.get("QUANTMATRIX_RUN_ID", ""),
                                           **health.record(config)})


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(SESSION, None)
    if session is not None:
        for line in health.summary_lines(config):
            terminalreporter.write_line(f"quantmatrix: {line}")
    if session is not None and session.layer_builds:
        pairs = sum(1 for key in session.memo if key[0] == "moe_layer")
        terminalreporter.write_line(f"quantmatrix: {session.layer_builds} MoE layer builds for {pairs} "
                                    "(checkpoint, arch) pairs")
