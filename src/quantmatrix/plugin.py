"""pytest hooks: load the matrix once, register its markers, parametrize suites' checks over its cells,
gate gpu-tier cases on this host's hardware, and stamp every case with what it ran on."""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quantmatrix import audit, checkpoints, dispatch, hardware, vllm_adapter
from quantmatrix.errors import CheckpointUnavailable, QuantmatrixError
from quantmatrix.matrix import Case, Cell, Matrix, closest, load

DEFAULT_MATRIX = Path("matrices") / "default.yaml"
_MATRIX_HELP = "matrix YAML file (default: matrices/default.yaml under the rootdir)"


@dataclasses.dataclass
class Settings:
    """Everything resolved once at configure time (pytest-timeout style); hooks read only this."""

    matrix: Matrix | None
    host: hardware.Host | None
    strict_hardware: bool
    today: datetime.date
    runner: str
    strict_checkpoints: bool = False
    checkpoint_dirs: dict[str, Path] = dataclasses.field(default_factory=dict)
    # Per-checkpoint results of checks, keyed by (check, what identifies the input): a cell's arch and
    # mode multiply the cases, not the work.
    layer_builds: int = 0  # every MoE layer built this session (the closing figure: builds vs cases)
    memo: dict[tuple[str, Any], Any] = dataclasses.field(default_factory=dict)

    def once(self, key: tuple[str, Any], compute: Callable[[], Any]) -> Any:
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def host_properties(self) -> list[tuple[str, str]]:
        """Per-case copies of the host facts: per-case properties survive xdist, testsuite ones do not."""
        props = list(vllm_adapter.versions().items())
        devices = self.host.devices if self.host else ()
        props += [("runner", self.runner),
                  ("device_name", ", ".join(d.name for d in devices)),
                  ("device_capability", ", ".join(f"{d.capability[0]}.{d.capability[1]}" for d in devices))]
        return props


SETTINGS = pytest.StashKey[Settings]()


def _arch_option(value: str) -> str:
    if not value.strip():
        raise pytest.UsageError("--arch needs a name from the matrix, e.g. --arch sm120 or --arch gb10")
    return value.strip()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("quantmatrix", "quantized MoE regression matrix")
    group.addoption("--matrix", default=None, metavar="FILE", help=_MATRIX_HELP)
    group.addoption("--arch", type=_arch_option, default=None, metavar="NAME",
                    help="treat this host as arch NAME (name or alias) instead of detecting its GPUs")
    group.addoption("--strict-hardware", action="store_true", default=False,
                    help="fail, instead of skip, gpu-tier cases whose arch this host lacks "
                         "(for a runner that is supposed to have that GPU)")
    group.addoption("--strict-checkpoints", action="store_true", default=False,
                    help="fail, instead of skip, cases whose hub checkpoint is not in the local HF cache "
                         "(for a runner that is supposed to hold them: see `quantmatrix fetch`)")
    parser.addini("quantmatrix_matrix", _MATRIX_HELP, default=None)


def _matrix_path(config: pytest.Config) -> Path | None:
    given = config.getoption("matrix") or config.getini("quantmatrix_matrix")
    if given:
        path = Path(given)
        if not path.is_absolute():
            path = (Path.cwd() if config.getoption("matrix") else config.rootpath) / path
        if not path.is_file():
            raise pytest.UsageError(f"--matrix {given}: no such file")
        return path
    default = config.rootpath / DEFAULT_MATRIX
    return default if default.is_file() else None


def pytest_configure(config: pytest.Config) -> None:
    path = _matrix_path(config)
    matrix = host = None
    if path is not None:
        try:
            matrix = load(path)
            host = hardware.detect(matrix, config.getoption("arch"))
        except QuantmatrixError as e:
            raise pytest.UsageError(str(e)) from None
        for name, help_line in matrix.markers().items():
            config.addinivalue_line("markers", f"{name}: {help_line}")
    elif config.getoption("arch"):
        raise pytest.UsageError(f"--arch needs a matrix: pass --matrix FILE or create {DEFAULT_MATRIX}")
    runner = os.environ.get("RUNNER_NAME") or socket.gethostname()
    config.stash[SETTINGS] = Settings(matrix, host, config.getoption("strict_hardware"),
                                      datetime.date.today(), runner,
                                      strict_checkpoints=config.getoption("strict_checkpoints"))


def pytest_report_header(config: pytest.Config) -> list[str]:
    s = config.stash[SETTINGS]
    if s.matrix is None:
        return []
    v = vllm_adapter.versions()
    return [f"quantmatrix: matrix {s.matrix.path} ({len(s.matrix.cells())} cells)",
            f"quantmatrix: host {s.host.describe(s.matrix) if s.host else '?'}; runner {s.runner}",
            f"quantmatrix: vllm {v['vllm_version']} ({v['vllm_distribution']}), torch {v['torch_version']}, "
            f"{v['platform']}"]


_MARKS: dict[tuple[str, ...], tuple[pytest.MarkDecorator, ...]] = {}


def _marks(case: Case, today: datetime.date) -> tuple[pytest.MarkDecorator, ...]:
    """Axis marks are shared per marker combination: building thousands of identical ones dominates collection."""
    names = case.markers
    marks = _MARKS.get(names)
    if marks is None:
        marks = _MARKS[names] = tuple(getattr(pytest.mark, n) for n in names)
    w = case.waiver
    if w is not None and not w.expired(today):
        marks += (pytest.mark.xfail(reason=f"waived until {w.expires}: {w.reason} ({w.link})", strict=False),)
    return marks


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" not in metafunc.fixturenames:
        return
    s = metafunc.config.stash[SETTINGS]
    where = f"{metafunc.definition.nodeid}"
    if s.matrix is None:
        raise pytest.UsageError(f"{where} is a matrix check but no matrix was found: pass --matrix FILE "
                                f"or create {DEFAULT_MATRIX} under the rootdir")
    name = metafunc.function.__name__.removeprefix("test_")
    check = s.matrix.checks.get(name)
    if check is None:
        raise pytest.UsageError(f"{where}: matrix {s.matrix.path} has no check {name!r}"
                                f"{closest(name, s.matrix.checks)}; add it under `checks:` or rename the test")
    params = [pytest.param(case, id=case.cell.id, marks=_marks(case, s.today)) for case in s.matrix.cases(check)]
    metafunc.parametrize("case", params)


def _case(item: pytest.Item) -> Case | None:
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("case") if callspec is not None else None
    return case if isinstance(case, Case) else None  # a check with no cells: pytest's empty-set placeholder


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture: a case that must not run (absent GPU, expired waiver) never builds anything."""
    case = _case(item)
    if case is None:
        return
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


@pytest.fixture
def case(request: pytest.FixtureRequest) -> Case:
    """The matrix case of this test; parametrized by the plugin, never requested by hand."""
    raise pytest.UsageError(f"{request.node.nodeid}: `case` is parametrized from the matrix only")


@pytest.fixture
def cell(case: Case) -> Cell:
    return case.cell


@pytest.fixture
def quantmatrix_settings(request: pytest.FixtureRequest) -> Settings:
    return request.config.stash[SETTINGS]


@pytest.fixture
def checkpoint_dir(cell: Cell, quantmatrix_settings: Settings) -> Path:
    """The cell's checkpoint on disk, built once per session; not available here -> skipped with the way out
    (failed under --strict-checkpoints: on a runner that should hold it, a skip would hide lost coverage)."""
    cache = quantmatrix_settings.checkpoint_dirs
    ck = cell.checkpoint
    if ck.id not in cache:
        try:
            cache[ck.id] = checkpoints.materialize(ck)
        except CheckpointUnavailable as e:
            if quantmatrix_settings.strict_checkpoints:
                pytest.fail(f"--strict-checkpoints: {e}", pytrace=False)
            pytest.skip(str(e))
    return cache[ck.id]


@pytest.fixture
def resolution(checkpoint_dir: Path, vllm: Any, quantmatrix_settings: Settings) -> vllm_adapter.Resolution:
    """vLLM's config resolution of the cell's checkpoint, once per checkpoint per session."""
    return quantmatrix_settings.once(("resolution", checkpoint_dir), lambda: vllm_adapter.resolve(checkpoint_dir))


def _build(settings: Settings, checkpoint_dir: Path, cell: Cell, every_layer: bool = False) -> dispatch.LayerBuild:
    build = dispatch.build_layer(checkpoint_dir, cell.arch, every_layer)
    settings.layer_builds += max(1, len(build.layers))
    return build


@pytest.fixture
def moe_layer(cell: Cell, checkpoint_dir: Path, vllm: Any, quantmatrix_settings: Settings) -> dispatch.LayerBuild:
    """vLLM's MoE block for the cell's checkpoint as built on the cell's (simulated) arch, once per pair."""
    return quantmatrix_settings.once(("moe_layer", checkpoint_dir, cell.arch.name),
                                     lambda: _build(quantmatrix_settings, checkpoint_dir, cell))


@pytest.fixture
def load_audit(cell: Cell, checkpoint_dir: Path, moe_layer: dispatch.LayerBuild,
               quantmatrix_settings: Settings) -> audit.Report:
    """The post-load audit of the cell's layer, once per (checkpoint, arch); the layer must have been built."""
    layer = moe_layer.layer
    if layer is None and cell.checkpoint.expectation("resolves_to") == "rejected":
        pytest.skip("vLLM refuses this config, as the matrix expects: there is no layer to audit")

    def run() -> audit.Report | str:
        backends = quantmatrix_settings.matrix.moe_backends
        if layer is None:
            return f"no MoE layer to audit: vLLM refused to build it ({moe_layer.error})"
        if layer.backend not in backends:
            return f"backend {layer.backend} is not described under moe_backends, so what it reads is unknown"
        backend = backends[layer.backend]
        every = _build(quantmatrix_settings, checkpoint_dir, cell, every_layer=True).layers
        return audit.audit(every, audit.checkpoint_tensors(checkpoint_dir), backend.reads, backend.single_input_scale)

    report = quantmatrix_settings.once(("audit", checkpoint_dir, cell.arch.name), run)
    if isinstance(report, str):
        pytest.fail(report, pytrace=False)
    return report


@pytest.fixture
def kernel_format(cell: Cell, checkpoint_dir: Path, vllm: Any, quantmatrix_settings: Settings) -> audit.KernelFormat:
    """vLLM's post-processing on a fresh layer (it rewrites parameters, so it never shares the audited one)."""
    build = quantmatrix_settings.once(("kernel_build", checkpoint_dir, cell.arch.name),
                                      lambda: _build(quantmatrix_settings, checkpoint_dir, cell))
    if build.layer is None and cell.checkpoint.expectation("resolves_to") == "rejected":
        pytest.skip("vLLM refuses this config, as the matrix expects: there is no layer to convert")
    if build.layer is None:
        pytest.fail(f"vLLM refused to build the MoE layer: {build.error}", pytrace=False)
    result = quantmatrix_settings.once(
        ("kernel_format", checkpoint_dir, cell.arch.name),
        lambda: audit.kernel_format(build.layer, audit.checkpoint_tensors(checkpoint_dir, build.layer.prefix)))
    if result.needs_cuda:
        pytest.skip(result.needs_cuda)
    return result


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stamp host-level properties into the JUnit file once, from the controller, after pytest wrote it
    (record_testsuite_property is lost under xdist)."""
    config = session.config
    xml = getattr(config.option, "xmlpath", None)
    s = config.stash.get(SETTINGS, None)
    if not xml or hasattr(config, "workerinput") or s is None or s.matrix is None or not Path(xml).is_file():
        return
    from quantmatrix.report import stamp_testsuite_properties

    archs = s.host.archs(s.matrix) if s.host else []
    stamp_testsuite_properties(Path(xml), {**dict(s.host_properties()), "matrix": str(s.matrix.path),
                                           "host_arch": " ".join(a.name for a in archs),
                                           "run_id": os.environ.get("QUANTMATRIX_RUN_ID", "")})


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    s = config.stash.get(SETTINGS, None)
    if s is not None and s.layer_builds:
        pairs = sum(1 for key in s.memo if key[0] == "moe_layer")
        terminalreporter.write_line(f"quantmatrix: {s.layer_builds} MoE layer builds for {pairs} "
                                    "(checkpoint, arch) pairs")


@pytest.fixture
def vllm() -> Any:
    """vLLM itself; a case that needs it is skipped, with the reason, where it is not installed."""
    reason = vllm_adapter.vllm_missing_reason()
    if reason:
        pytest.skip(reason)
    import vllm as module

    return module
