"""pytest side of the e2e tier (pytest11 entry point `quantmatrix_e2e`): the session's engine-run store, one
engine start per group shared by its checks, xdist grouping, writing references under `--update-references`,
and the closing note (engine starts vs cases, time outside vLLM).

Groups are cells (checkpoint x arch x mode). Under `-n N --dist loadgroup` every check of a group goes to one
worker (an `xdist_group` mark per e2e case), and each worker is pinned to its own GPU, or to its own group of N
under `--gpus-per-worker N`, when the settings are resolved (pytest_plugin.runner).
Under any other distribution a group still starts once: the store is a directory all workers share, with a lock
per group.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quantmatrix import properties as P
from quantmatrix.adapter.versions import engine_platform
from quantmatrix.checkpoints import store
from quantmatrix.checks import e2e as checks_e2e
from quantmatrix.checks import quality
from quantmatrix.engine import references, runner
from quantmatrix.host import sanitizer
from quantmatrix.measure import hf
from quantmatrix.measure import sanitized as measure_sanitized
from quantmatrix.measure.sanitized import Sanitized
from quantmatrix.pytest_plugin.options import UPDATE_REFERENCES
from quantmatrix.pytest_plugin.settings import SETTINGS, Settings, case_of, xdist_group
from quantmatrix.schema.e2e import E2E
from quantmatrix.schema.model import Case, Cell

_STORE_KEY = "quantmatrix_e2e_store"
KEEP_STORES = 5  # past sessions' engine logs kept under <cache>/e2e for post-mortems


@dataclasses.dataclass(frozen=True)
class E2ESettings:
    """Resolved once per process: the session's engine-run store (shared by every xdist worker) and the platform
    entry that applies (whether this run writes references is in the core Settings)."""

    store: runner.Store
    platform: str


@dataclasses.dataclass
class E2ESession:
    """What this process saw: the e2e cases judged (the closing note), the references it wrote."""

    e2e_cases: set[str] = dataclasses.field(default_factory=set)
    written: set[Path] = dataclasses.field(default_factory=set)


E2E_SETTINGS = pytest.StashKey[E2ESettings]()
E2E_SESSION = pytest.StashKey[E2ESession]()


def _new_store_root() -> Path:
    """<cache>/e2e/<time>-<id> (made by the first engine run), pruning all but the most recent sessions."""
    parent = store.cache_root() / "e2e"
    if parent.is_dir():
        for old in sorted(p for p in parent.iterdir() if p.is_dir())[:-KEEP_STORES + 1]:
            shutil.rmtree(old, ignore_errors=True)
    return parent / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if SETTINGS not in config.stash:  # `-p no:quantmatrix`: no matrix, so no e2e tier either
        return
    workerinput = getattr(config, "workerinput", None)  # xdist's public view of a worker (our store)
    root = Path(workerinput[_STORE_KEY]) if workerinput and _STORE_KEY in workerinput else _new_store_root()
    settings = E2ESettings(runner.Store(root), engine_platform())
    config.stash[E2E_SETTINGS] = settings
    config.stash[E2E_SESSION] = session = E2ESession()
    config.pluginmanager.register(_CaseCounter(session), "quantmatrix_e2e_counter")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: every worker shares the controller's store."""
    if E2E_SETTINGS in node.config.stash:
        node.workerinput[_STORE_KEY] = str(node.config.stash[E2E_SETTINGS].store.root)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Before xdist reads them: all checks of one engine group carry the same xdist_group."""
    for item in items:
        case = case_of(item)
        if case is not None and "engine_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(xdist_group(case.cell)))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker under `--dist loadgroup`, every grouped item's node id must now end in `@<group>` (the
    scheduler groups by that suffix). A pytest that no longer lets xdist set it would spread a cell's checks over
    workers without a word: refuse instead."""
    config = session.config
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
        return
    for item in session.items:
        nodeid = item.nodeid
        if item.get_closest_marker("xdist_group") is not None and nodeid.rfind("@") < nodeid.rfind("]"):
            raise pytest.UsageError(
                f"--dist loadgroup does not group here: pytest {pytest.__version__} with pytest-xdist "
                f"{_version('pytest-xdist')} left {nodeid!r} without its '@<group>' suffix, so the "
                "checks of one engine cell would run on several workers; install the pytest quantmatrix pins "
                "(pip install -e .) or run without --dist loadgroup")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def pytest_report_header(config: pytest.Config) -> list[str]:
    s = config.stash.get(E2E_SETTINGS, None)
    if s is None:
        return []
    line = f"quantmatrix e2e: platform {s.platform}, engine runs under {s.store.root}"
    if config.stash[SETTINGS].update_references:
        line += f"; {UPDATE_REFERENCES.name}: this run writes references"
    return [line]


class _CaseCounter:
    """Counts the cases that judged an engine run (reports from xdist workers arrive here too)."""

    def __init__(self, session: E2ESession) -> None:
        self.session = session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and any(k == P.ENGINE_GROUP for k, _ in report.user_properties):
            self.session.e2e_cases.add(report.nodeid)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The closing note: engine starts vs e2e cases, and what each group cost outside vLLM."""
    s = config.stash.get(E2E_SETTINGS, None)
    if s is None:
        return
    cases = config.stash[E2E_SESSION].e2e_cases
    starts = s.store.starts()
    if not starts and not cases:
        return
    tr = terminalreporter
    tr.section("quantmatrix e2e")
    tr.write_line(f"{len(starts)} engine starts for {len(cases)} e2e cases ({s.store.root})")
    for d in starts:
        saved = d / "run.json"
        if not saved.is_file():
            tr.write_line(f"  {d.name}: no result (interrupted)")
            continue
        run = runner.load_run(saved)
        if run.failure is not None:
            tr.write_line(f"  {run.cell_id}: FAILED ({run.failure.cause}) after {run.wall_s:.1f} s")
            continue
        t = run.result["timings"]
        tr.write_line(f"  {run.cell_id}: {run.wall_s:.1f} s wall = engine start {t['load_s']:.1f} s + generate "
                      f"{t['generate_s']:.1f} s + suite overhead {run.overhead_s():.1f} s (vllm import "
                      f"{t['import_s']:.1f} s)")


# ------------------------------------------------------------------------------------------ fixtures


def _e2e(settings: Settings) -> E2E:
    if settings.matrix is None or settings.matrix.e2e is None:
        raise pytest.UsageError(f"{settings.matrix.path if settings.matrix else 'the matrix'} has e2e checks "
                                "but no `e2e:` section (prompts, references, generation, platforms)")
    return settings.matrix.e2e


@pytest.fixture
def e2e(quantmatrix_settings: Settings) -> E2E:
    """The matrix's e2e settings (prompts, generation, references, reference mode)."""
    return _e2e(quantmatrix_settings)


@dataclasses.dataclass(frozen=True)
class EngineCheckpoint:
    """What the engine runs for a cell: the checkpoint itself, or (synthetic, on a platform that says so) its
    twin built at another size from the same spec and seed; `size` names the twin (None: the checkpoint)."""

    path: Path
    size: str | None


@pytest.fixture
def engine_checkpoint(case: Case, checkpoint_dir: Path, e2e: E2E, request: pytest.FixtureRequest
                      ) -> EngineCheckpoint:
    ck = case.cell.checkpoint
    plat = e2e.platforms.get(request.config.stash[E2E_SETTINGS].platform)
    size = plat.synthetic_size if plat else None
    twin = store.twin(ck, size) if size is not None else None
    return EngineCheckpoint(twin, size) if twin is not None else EngineCheckpoint(checkpoint_dir, None)


@pytest.fixture
def engine_runs(request: pytest.FixtureRequest, e2e: E2E, engine_checkpoint: EngineCheckpoint
                ) -> Callable[[Cell], runner.GroupRun]:
    """Run (or reuse) the engine group of a cell of this checkpoint: one start per group per session,
    whichever worker asks."""
    s = request.config.stash[E2E_SETTINGS]
    given = request.config.stash[SETTINGS].compute_sanitizer

    def run(cell: Cell) -> runner.GroupRun:
        sanitized = cell.mode.sanitizer is not None
        prompts = () if sanitized else tuple(t["prompt"] for t in checks_e2e.tasks(cell.checkpoint))
        exe = sanitizer.find(given) if sanitized else None
        req = runner.build_request(e2e, cell, engine_checkpoint.path, s.platform, prompts, exe)
        env = runner.child_env(e2e, cell, s.platform, os.environ)
        return s.store.get_or_run(req, env, runner.timeout_s(e2e, cell))

    return run


@pytest.fixture
def engine_run(case: Case, engine_runs: Callable[[Cell], runner.GroupRun]) -> runner.GroupRun:
    """This case's group run, shared by every check of the group."""
    return engine_runs(case.cell)


@pytest.fixture
def sanitized_run(engine_run: runner.GroupRun) -> Sanitized | None:
    """The run's compute-sanitizer logs mapped through its workers' parameter records (None: no result to map)."""
    if engine_run.result is None:
        return None
    return measure_sanitized.of_run(engine_run.sanitizer_logs(), engine_run.workers())


@pytest.fixture
def reference_mode_run(case: Case, e2e: E2E, quantmatrix_settings: Settings,
                       engine_runs: Callable[[Cell], runner.GroupRun]) -> Callable[[], runner.GroupRun]:
    """The same checkpoint and arch in the reference mode, run only when asked (a degenerate group never does)."""
    matrix = quantmatrix_settings.matrix
    assert matrix is not None
    cell = Cell(case.cell.checkpoint, case.cell.arch, matrix.mode(e2e.reference_mode))
    return lambda: engine_runs(cell)


@pytest.fixture
def reference(request: pytest.FixtureRequest, case: Case, engine_checkpoint: EngineCheckpoint,
              engine_run: runner.GroupRun, e2e: E2E) -> checks_e2e.LoadReference:
    """Load this cell's reference of a kind; under --update-references write it from the trusted source first."""
    update = request.config.stash[SETTINGS].update_references
    written = request.config.stash[E2E_SESSION].written
    size = engine_checkpoint.size

    def load(kind: str) -> dict[str, Any]:
        target = references.path(e2e.references, case.cell, kind, size)
        if update and target not in written:
            body, by = _trusted(case, kind, engine_checkpoint.path, engine_run, e2e)
            references.write(e2e.references, case.cell, kind, body, by, size)
            written.add(target)
        data = references.load(e2e.references, case.cell, kind, size)
        if not references.reviewed(data):  # compared all the same: the report lists it until a person accepts it
            request.node.user_properties.append((P.UNREVIEWED_REFERENCE, str(target)))
        return data

    return load


def _trusted(case: Case, kind: str, checkpoint_dir: Path, run: runner.GroupRun,
             e2e: E2E) -> tuple[dict[str, Any], dict[str, Any]]:
    """(body, produced_by) of a reference from the source the checkpoint names."""
    source = case.cell.checkpoint.expectation("reference")
    if source == "engine":
        by = {"source": "engine", "cell": case.cell.id, **run.result["versions"], "device": run.result["device"]}
        if kind == "outputs":
            return {"prompts": list(e2e.prompts), "outputs": run.greedy()}, by
        rows = checks_e2e.tasks(case.cell.checkpoint)
        solved = quality.score([o["text"] for o in run.tasks()], [r["answer"] for r in rows])
        return {"correct": sum(solved), "n": len(solved)}, by
    weights = references.reference_weights(checkpoint_dir)
    if kind == "outputs":
        made = hf.transformers_greedy(weights, e2e.prompts, e2e.max_tokens, e2e.logprobs)
        return {"prompts": list(e2e.prompts), "outputs": made["outputs"]}, made["produced_by"]
    rows = checks_e2e.tasks(case.cell.checkpoint)
    made = hf.transformers_greedy(weights, [r["prompt"] for r in rows], e2e.max_tokens, 1)
    solved = quality.score([o["text"] for o in made["outputs"]], [r["answer"] for r in rows])
    return {"correct": sum(solved), "n": len(solved)}, made["produced_by"]
