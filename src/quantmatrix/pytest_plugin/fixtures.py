"""The fixtures suites/ asks for: the case and its cell, what each check measures (computed once per
checkpoint or per (checkpoint, arch) and cached on the Session), and the one `judge` every check goes through.

Measuring modules that import torch or vLLM are imported inside the fixtures that need them, so that collecting
the suites imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quantmatrix import properties as P
from quantmatrix.adapter import layers
from quantmatrix.adapter.config import Resolution
from quantmatrix.adapter.kernel import KernelFormat
from quantmatrix.adapter.versions import vllm_missing_reason
from quantmatrix.checkpoints import store
from quantmatrix.checkpoints.lint import LintReport
from quantmatrix.checks.verdict import SKIP, Check, Verdict
from quantmatrix.errors import CheckpointUnavailable, QuantmatrixError
from quantmatrix.host.probe import Seen
from quantmatrix.measure.dequant import LogitError
from quantmatrix.measure.hf import HfGreedy
from quantmatrix.measure.loaded import AuditReport
from quantmatrix.measure.numerics import BackendRun
from quantmatrix.measure.observed import Observation
from quantmatrix.measure.ranked import Ranked
from quantmatrix.pytest_plugin import gates
from quantmatrix.pytest_plugin.options import STRICT_CHECKPOINTS
from quantmatrix.pytest_plugin.settings import SESSION, SETTINGS, Session, Settings
from quantmatrix.schema.model import Case, Cell, Checkpoint, Matrix


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
def quantmatrix_session(request: pytest.FixtureRequest) -> Session:
    return request.config.stash[SESSION]


@pytest.fixture
def matrix(quantmatrix_settings: Settings) -> Matrix:
    assert quantmatrix_settings.matrix is not None  # a case exists only when a matrix was loaded
    return quantmatrix_settings.matrix


@pytest.fixture
def judge(record_property: Callable[[str, object], None]) -> Callable[..., None]:
    """Turn a check's verdict into the case's outcome: properties recorded, then fail / skip with the verdict's
    words. A QuantmatrixError from the check (a matrix that states no expectation) fails the case, headed as every
    failure is."""

    def decide(check: Check, case: Case, *measured: Any) -> None:
        try:
            v = check(case, *measured)
        except QuantmatrixError as e:
            v = Verdict.fail(case, str(e))
        for key, value in v.properties:
            record_property(key, value)
        if v.outcome == SKIP:
            pytest.skip(v.message)
        if v.problem is not None:
            pytest.fail(v.message, pytrace=False)

    return decide


@pytest.fixture
def checkpoint_dir(cell: Cell, quantmatrix_settings: Settings, quantmatrix_session: Session,
                   record_property: Callable[[str, object], None]) -> Path:
    """The cell's checkpoint on disk, built once per session; not available here -> skipped with the way out
    (failed under --strict-checkpoints: on a runner that should hold it, a skip would hide lost coverage).
    A hub checkpoint's case records the revision asked for and the snapshot (commit) it read."""
    ck = cell.checkpoint
    key = ("checkpoint", ck.id)
    if key not in quantmatrix_session.memo:
        try:
            quantmatrix_session.memo[key] = store.materialize(ck)
        except CheckpointUnavailable as e:
            short = gates.too_few_gpus(quantmatrix_settings, cell)
            if short and _configs_cached(ck):  # its runner fetched the config files only (quantmatrix fetch)
                pytest.skip(f"{short}, so this runner holds only its config files; the file checks run on a runner "
                            f"that serves it ({e})")
            gates.strict(STRICT_CHECKPOINTS.name, quantmatrix_settings.strict_checkpoints, str(e)).now()
    path = quantmatrix_session.memo[key]
    if ck.source.kind == "hub":  # resolve_hub returns snapshots/<commit>
        record_property(P.CHECKPOINT_REVISION, ck.source.value[1])
        record_property(P.CHECKPOINT_SNAPSHOT, path.name)
    return path


def _configs_cached(ck: Checkpoint) -> bool:
    if ck.source.kind != "hub":
        return False
    try:
        store.resolve_hub(*ck.source.value, configs_only=True)
    except CheckpointUnavailable:
        return False
    return True


@pytest.fixture
def config_dir(cell: Cell, quantmatrix_settings: Settings, request: pytest.FixtureRequest) -> Path:
    """What config resolution reads: the checkpoint, or for a hub checkpoint this host has too few GPUs to
    serve, the snapshot of its config files that `quantmatrix fetch` leaves on such a runner."""
    ck = cell.checkpoint
    if ck.source.kind == "hub" and gates.too_few_gpus(quantmatrix_settings, cell):
        try:
            return store.resolve_hub(*ck.source.value, configs_only=True)
        except CheckpointUnavailable:
            pass  # not even the configs: the checkpoint's own skip or failure says how to get it
    return request.getfixturevalue("checkpoint_dir")


@pytest.fixture
def vllm_importable() -> None:
    """The gate of every fixture that measures through vLLM: a case that needs it is skipped, with the reason,
    where vLLM is not importable (the measuring goes through quantmatrix.adapter, never through the module)."""
    reason = vllm_missing_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def resolution(config_dir: Path, vllm_importable: None, quantmatrix_session: Session) -> Resolution:
    """vLLM's config resolution of the cell's checkpoint (its config files), once per checkpoint per session."""
    from quantmatrix.adapter import config

    return quantmatrix_session.once(("resolution", config_dir), lambda: config.resolve(config_dir))


def _build(session: Session, checkpoint_dir: Path, cell: Cell, every_layer: bool = False) -> layers.LayerBuild:
    build = layers.build(checkpoint_dir, cell.arch.capability, every_layer)
    session.layer_builds += max(1, len(build.layers))
    return build


def _layer(kind: str, session: Session, checkpoint_dir: Path, cell: Cell,
           record_property: Callable[[str, object], None]) -> layers.LayerBuild:
    """The `kind` build of the cell's MoE block, once per (checkpoint, arch), recording the optional kernel
    packages hidden from vLLM for it: its verdict holds for "without them"."""
    build = session.once((kind, checkpoint_dir, cell.arch.name), lambda: _build(session, checkpoint_dir, cell))
    if build.simulated_without:
        record_property(P.SIMULATED_WITHOUT, ",".join(build.simulated_without))
    return build


@pytest.fixture
def ranked(cell: Cell, checkpoint_dir: Path, vllm_importable: None, matrix: Matrix, quantmatrix_session: Session,
           record_property: Callable[[str, object], None]) -> Ranked:
    """Every rank's measurement of the cell's checkpoint under the cell's layout (measure.ranks): one process per
    rank in a gloo world (measure.pool), or this process for a one-rank layout; once per (checkpoint, layout),
    every arch measured by the same ranks."""
    from quantmatrix.measure import ranked, ranks, shards, split

    layout = cell.layout
    job = ranked.Job(str(checkpoint_dir), layout.tp, layout.ep, tuple((a.name, a.capability) for a in matrix.archs),
                    {n: (tuple(sorted(b.reads)), b.single_input_scale) for n, b in matrix.moe_backends.items()})
    session = quantmatrix_session
    results = session.once(("ranks", checkpoint_dir, layout.name), lambda: (
        session.rank_pool().run(job) if layout.ranks > 1 else [ranks.measure(job, 0)]))
    impossible = session.once(("split", checkpoint_dir, layout.name), lambda: split.impossible(
        split.Checkpoint(checkpoint_dir), shards.moe_ranks(layout.tp, layout.ep)))
    out = ranked.combine(results, layout.tp, layout.ep, cell.arch.name, impossible)
    hidden = sorted({p for b in out.builds.values() for p in b.simulated_without})
    if hidden:
        record_property(P.SIMULATED_WITHOUT, ",".join(hidden))
    return out


@pytest.fixture
def moe_layer(cell: Cell, checkpoint_dir: Path, vllm_importable: None, quantmatrix_session: Session,
              record_property: Callable[[str, object], None], request: pytest.FixtureRequest
              ) -> layers.LayerBuild | Ranked:
    """vLLM's MoE block for the cell's checkpoint as built on the cell's (simulated) arch, once per pair; under a
    layout of several ranks, every rank's."""
    if cell.layout.ranks > 1:
        return request.getfixturevalue("ranked")
    return _layer("moe_layer", quantmatrix_session, checkpoint_dir, cell, record_property)


@pytest.fixture
def load_audit(cell: Cell, checkpoint_dir: Path, moe_layer: layers.LayerBuild | Ranked, matrix: Matrix,
               quantmatrix_session: Session) -> AuditReport | None:
    """The post-load audit of every MoE layer, once per (checkpoint, arch); None when there is no layer or its
    backend's reads are unknown (the verdict says which). Under several ranks: every rank's, as one report."""
    if isinstance(moe_layer, Ranked):
        return moe_layer.audit
    layer = moe_layer.layer
    backend = matrix.moe_backends.get(layer.backend) if layer is not None else None
    if backend is None:
        return None

    def run() -> AuditReport:
        from quantmatrix.measure import sentinel

        every = _build(quantmatrix_session, checkpoint_dir, cell, every_layer=True).layers
        return sentinel.audit(every, sentinel.checkpoint_tensors(checkpoint_dir), backend.reads,
                              backend.single_input_scale)

    return quantmatrix_session.once(("audit", checkpoint_dir, cell.arch.name), run)


@pytest.fixture
def kernel_layer(cell: Cell, checkpoint_dir: Path, vllm_importable: None, quantmatrix_session: Session,
                 record_property: Callable[[str, object], None], request: pytest.FixtureRequest
                 ) -> layers.LayerBuild | Ranked:
    """A fresh layer for the kernel-format conversion (it rewrites parameters, so it never shares the audited
    one); under several ranks, every rank's (each converted its own fresh load)."""
    if cell.layout.ranks > 1:
        return request.getfixturevalue("ranked")
    return _layer("kernel_build", quantmatrix_session, checkpoint_dir, cell, record_property)


@pytest.fixture
def kernel_format(cell: Cell, checkpoint_dir: Path, kernel_layer: layers.LayerBuild | Ranked,
                  quantmatrix_session: Session) -> KernelFormat | dict[int, KernelFormat | None] | None:
    """vLLM's post-processing of the freshly loaded layer, once per (checkpoint, arch); None without a layer;
    under several ranks, each rank's."""
    if isinstance(kernel_layer, Ranked):
        return kernel_layer.kernels
    layer = kernel_layer.layer
    if layer is None:
        return None

    def run() -> KernelFormat:
        from quantmatrix.adapter import kernel
        from quantmatrix.measure import sentinel

        layer.load(sentinel.checkpoint_tensors(checkpoint_dir, layer.prefix)())
        return kernel.kernel_format(layer)

    return quantmatrix_session.once(("kernel_format", checkpoint_dir, cell.arch.name), run)


@pytest.fixture
def layer_numerics(cell: Cell, checkpoint_dir: Path, vllm_importable: None, matrix: Matrix,
                   quantmatrix_session: Session) -> list[BackendRun]:
    """vLLM's MoE experts against the bf16 reference the checkpoint's files decode to: the oracle's pick on this
    host's own platform (once per checkpoint), then on the cell's simulated arch the oracle's pick and every
    override word the scheme's read-sets name (once per checkpoint and arch). [] where vLLM refuses the config."""
    from quantmatrix.adapter import families
    from quantmatrix.measure import numerics

    scheme = cell.checkpoint.expectation("resolves_to")
    if scheme == "rejected":
        return []
    session = quantmatrix_session
    quantized = scheme != "unquantized"
    state = session.once(("dequantized_state" if quantized else "tensors", checkpoint_dir),
                         lambda: numerics.reference_state(checkpoint_dir, quantized))
    host = session.once(("numerics_host", checkpoint_dir),
                        lambda: numerics.run(checkpoint_dir, None, "auto", numerics.HOST, state))
    backends = matrix.moe_backends
    words = [w for n in families.read_sets(scheme, backends) or () if (w := backends[n].override)]
    arch = cell.arch
    return [host, *session.once(("numerics", checkpoint_dir, arch.name), lambda: numerics.measure(
        checkpoint_dir, arch.capability, arch.name, words, state))]


@pytest.fixture
def observed_reads(cell: Cell, engine_checkpoint: Any, vllm_importable: None,
                   quantmatrix_session: Session) -> Observation:
    """What the cell's backend really reads, measured on this host's GPU with the checkpoint the engine runs (a
    synthetic one's GPU-sized twin), once per (checkpoint, arch)."""
    from quantmatrix.measure import observed

    path = engine_checkpoint.path
    return quantmatrix_session.once(("observed_reads", path, cell.arch.name),
                                    lambda: observed.measure(path, cell.arch.capability))


@pytest.fixture
def lint_report(checkpoint_dir: Path, quantmatrix_session: Session) -> LintReport:
    """The checkpoint lint with block scales read, once per checkpoint."""
    from quantmatrix.checkpoints import lint

    return quantmatrix_session.once(("lint", checkpoint_dir), lambda: lint.lint(checkpoint_dir, block_scales=True))


@pytest.fixture
def hf_greedy(cell: Cell, checkpoint_dir: Path, quantmatrix_session: Session) -> HfGreedy:
    """transformers' greedy output from the checkpoint's files, and its in-memory model's (once per checkpoint)."""
    from quantmatrix.measure import hf

    spec = store.spec_of(cell.checkpoint)
    return quantmatrix_session.once(("hf_reference", checkpoint_dir), lambda: hf.hf_greedy(checkpoint_dir, spec))


@pytest.fixture
def dequant_error(cell: Cell, checkpoint_dir: Path, vllm_importable: None, quantmatrix_session: Session) -> LogitError:
    """The logits of the model the checkpoint's files decode to (vLLM's dequantization) against its bf16
    family's, once per distinct decoded model."""
    from quantmatrix.checkpoints import base
    from quantmatrix.measure import dequant

    bf16 = store.base_of(cell.checkpoint)
    state = quantmatrix_session.once(("dequantized_state", checkpoint_dir),
                                     lambda: dequant.dequantized_state(checkpoint_dir))
    key = ("dequant_logits", dequant.digest(state), bf16)
    return quantmatrix_session.once(key, lambda: dequant.dequant_error(state, bf16, base.prompts()))


@pytest.fixture
def device_seen(cell: Cell) -> Seen:
    """What a child process with the mode's environment sees of cuda:0 (it runs on the gpu tier only)."""
    from quantmatrix.host import probe

    return probe.run(cell.mode.env)
