"""pytest hooks (entry point `pytest11: quantmatrix`): add the options (pytest_plugin.options) and the
`pytest_quantmatrix_host` hook with quantmatrix's own answer, resolve the Settings once, register the matrix's
markers, parametrize suites' checks over its cells, stamp every case with what it ran on, and ask the gates
(pytest_plugin.gates) before it runs. The fixtures live in pytest_plugin.fixtures, registered from here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quantmatrix import properties as P
from quantmatrix.adapter.versions import versions
from quantmatrix.errors import OptionError
from quantmatrix.host.detect import Host, detect
from quantmatrix.pytest_plugin import fixtures, gates, health, hooks, options
from quantmatrix.pytest_plugin.junit import matrix_cases, matrix_name, stamp_testsuite_properties
from quantmatrix.pytest_plugin.options import MATRIX_HELP
from quantmatrix.pytest_plugin.settings import SESSION, SETTINGS, Session, case_of, resolve
from quantmatrix.schema.load import DEFAULT_MATRIX
from quantmatrix.schema.model import Case, Matrix
from quantmatrix.schema.yamldoc import closest


def _usage(flag: options.Flag) -> Callable[[str], Any]:
    """The flag's one validation as a pytest option type: a bad value is a usage error naming the flag."""
    def parse(value: str) -> Any:
        try:
            return flag.value(value)
        except OptionError as e:
            raise pytest.UsageError(str(e)) from None
    return parse


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("quantmatrix", "quantized MoE regression matrix")
    for flag in options.FLAGS:
        if flag.parse is None:
            group.addoption(flag.name, action="store_true", default=False, help=flag.help)
        else:
            group.addoption(flag.name, type=_usage(flag), default=flag.default, metavar=flag.metavar,
                            help=flag.help)
    parser.addini("quantmatrix_matrix", MATRIX_HELP, default=None)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)


@pytest.hookimpl(trylast=True)
def pytest_quantmatrix_host(matrix: Matrix, arch: str | None) -> Host:
    """quantmatrix's own detection, asked when no runner's conftest answered first."""
    return detect(matrix, arch)


def pytest_configure(config: pytest.Config) -> None:
    settings = resolve(config)  # pins an xdist worker to its GPUs first: the worker detects only its own
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
        raise pytest.UsageError(f"{where} is a matrix check but no matrix was found: pass {options.MATRIX.name} FILE "
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
    """Before any fixture: the case is stamped with what it is and where it runs, then the first gate that says
    it must not run (pytest_plugin.gates: time limit, expired waiver, absent GPU, ...) skips or fails it, so it
    never builds anything."""
    case = case_of(item)
    if case is None:
        return
    s = item.config.stash[SETTINGS]
    c = case.cell
    item.user_properties += [
        (P.CHECKPOINT, c.checkpoint.id), (P.SCHEME, c.checkpoint.scheme.name),
        (P.PRODUCER, c.checkpoint.producer), (P.ARCH, c.arch.name), (P.MODE, c.mode.name),
        (P.LAYOUT, c.layout.name),
        (P.CHECK, case.check.name), (P.KIND, case.check.kind), (P.TIER, case.check.tier), (P.CELL, c.id),
        *s.host_properties(),
    ]
    w = case.waiver
    if w is not None:
        item.user_properties += [(P.WAIVER_REASON, w.reason), (P.WAIVER_LINK, w.link),
                                 (P.WAIVER_EXPIRES, str(w.expires)),
                                 (P.WAIVER_EXPIRED, str(w.expired(s.today)).lower())]
    stop = gates.first_stop(item.config, case)
    if stop is not None:
        item.user_properties += stop.properties
        stop.now()


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
    stamp_testsuite_properties(Path(xml), {**dict(s.host_properties()),
                                           P.MATRIX: matrix_name(s.matrix, config.rootpath),
                                           P.MATRIX_CASES: matrix_cases(s.matrix, config.rootpath, s.today),
                                           P.TIME_LIMIT_S: str(s.time_limit or ""),
                                           P.HOST_ARCH: " ".join(a.name for a in archs),
                                           P.RUN_ID: s.run_id,
                                           **health.record(config)})


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION, None)
    if session is not None:
        session.close()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(SESSION, None)
    if session is not None:
        for line in health.summary_lines(config):
            terminalreporter.write_line(f"quantmatrix: {line}")
    if session is not None and session.layer_builds:
        pairs = sum(1 for key in session.memo if key[0] == "moe_layer")
        terminalreporter.write_line(f"quantmatrix: {session.layer_builds} MoE layer builds for {pairs} "
                                    "(checkpoint, arch) pairs")
    pool = session.pool if session is not None else None
    if pool is not None and pool.jobs:
        terminalreporter.write_line(f"quantmatrix: {pool.ranks_built} ranks built in their own processes for "
                                    f"{pool.jobs} (checkpoint, layout) pairs in {pool.seconds:.1f} s "
                                    f"({pool.ranks_built / max(pool.seconds, 1e-9):.2f} ranks/s)")
