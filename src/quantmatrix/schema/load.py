"""Load a matrix file: safe YAML, validated node by node, each section built by its own function.

Every error is a MatrixError that starts with file:line:column and names the key, what was expected and, for a
misspelt name, the closest valid one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from quantmatrix import bounded
from quantmatrix.errors import MatrixError
from quantmatrix.schema import backends as moe_backends
from quantmatrix.schema import e2e, fields, layouts, limits, sanitizer
from quantmatrix.schema.factory import SCHEMES as FACTORY_SCHEMES
from quantmatrix.schema.model import (
    Arch,
    Check,
    Checkpoint,
    Matrix,
    Mode,
    MoeBackend,
    PerArch,
    Scheme,
    Waiver,
)
from quantmatrix.schema.selectors import Selectors, narrow
from quantmatrix.schema.synthetic import SyntheticSpec
from quantmatrix.schema.vocab import HUB_COMMIT, PRODUCERS, TIERS, VLLM_PARTS
from quantmatrix.schema.yamldoc import (
    Doc,
    Field,
    as_bool,
    as_date,
    as_text,
    closest,
    engine_arguments,
    env_vars,
    int_at_least,
    list_of,
    one_of,
    positive,
)

_LABEL = limits.text_at_most(limits.LABEL_CHARS, "a label")


def _nodes(help_text: str, required: bool = True) -> Field:
    return Field(lambda d, n, w: tuple(d.sequence(n, w)), help_text, required=required, default=())


# Where a checkout keeps its matrix files, and the one a run reads when it is named none (the plugin under its
# rootdir, the CLI under the checkout).
MATRICES = Path("matrices")
DEFAULT_MATRIX = MATRICES / "default.yaml"

# libyaml's parser when PyYAML has it (8x faster on a big matrix), with the same safe node graph and marks.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_TOP = {
    "version": Field(one_of((1,)), "schema version, 1"),
    "archs": _nodes("list of GPU archs"),
    "modes": _nodes("list of allocator/exec modes"),
    "layouts": _nodes("parallel layouts checked besides each checkpoint's serving one", required=False),
    "schemes": _nodes("list of quantization schemes"),
    "checks": _nodes("list of checks (suites/ test_<name>)"),
    "checkpoints": _nodes("list of checkpoints"),
    "include": _nodes("cell selectors to keep", required=False),
    "exclude": _nodes("cell selectors to drop", required=False),
    "waivers": _nodes("known failures", required=False),
    "moe_backends": _nodes("MoE kernel backends and what they read (over the packaged read-sets)", required=False),
    "e2e": Field(lambda d, n, w: n, "engine tier settings (prompts, references, generation, platforms)",
                 required=False),
    "max_cells": Field(int_at_least(1), f"most cells (checkpoints x archs x modes x layouts) the matrix may expand to "
                       f"(default {limits.MAX_CELLS})", required=False),
    "allow_floating_revisions": Field(as_bool, "accept a hub revision that is a branch or tag (default false: "
                                      "every hub revision a 40-hex commit)", required=False, default=False),
}


def load(path: str | Path, trusted: bool = False) -> Matrix:
    """Parse and validate a matrix file (`trusted`: --trust-matrix); a problem is a MatrixError at file:line:col."""
    path = Path(path)
    try:
        data = bounded.read_bytes(path, "matrix")
        text = data.decode("utf-8")
    except bounded.InputError as e:
        raise MatrixError(f"{path}: cannot read matrix: {e.why}") from None
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise MatrixError(f"{path}:{line}:{column}: not UTF-8 (byte 0x{data[e.start]:02x})") from None
    doc = Doc(path, trusted)
    try:
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        loc = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise MatrixError(f"{loc}: not valid YAML: {e.problem or e.context}") from None
    except yaml.reader.ReaderError as e:  # a NUL or other unprintable character: where, from its offset
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        code = e.character if isinstance(e.character, int) else ord(e.character[:1] or "?")
        raise MatrixError(f"{path}:{line}:{column}: not valid YAML: unprintable character #x{code:02x}") from None
    except yaml.YAMLError as e:
        raise MatrixError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise MatrixError(f"{path}: not valid YAML: nested too deep") from None
    if root is None:
        raise MatrixError(f"{path}:1:1: the matrix file is empty")
    limits.check_nodes(path, root)
    return _build(doc, doc.record(root, "matrix", _TOP))


def _unique(doc: Doc, seen: dict[str, str], name: str, node: yaml.Node, what: str) -> None:
    if name in seen:
        raise doc.error(node, f"duplicate {what} {name!r} (already defined at {seen[name]})")
    seen[name] = doc.where(node)


def _archs(doc: Doc, nodes: tuple[yaml.Node, ...]) -> tuple[Arch, ...]:
    names: dict[str, str] = {}
    caps: dict[tuple[int, int], str] = {}
    archs = []
    for i, node in enumerate(nodes):
        r = doc.record(node, f"archs[{i}]", {
            "name": Field(fields.marker, "arch name, e.g. sm120"),
            "capability": Field(fields.capability, "compute capability, e.g. '12.0'"),
            "aliases": Field(list_of(fields.marker), "other names (marker aliases)", required=False, default=()),
            "label": Field(_LABEL, "human label, e.g. 'RTX PRO 6000'"),
            "engine_args": Field(engine_arguments, "engine arguments on this arch", required=False, default=dict),
        })
        for n, nd in ((r["name"], r["@name"]), *((a, r["@aliases"]) for a in r["aliases"])):
            _unique(doc, names, n, nd, "arch name or alias")
        if r["capability"] in caps:
            raise doc.error(node, f"arch {r['name']!r} has capability {r['capability']} already used by "
                                  f"{caps[r['capability']]!r}: capabilities map to exactly one arch")
        caps[r["capability"]] = r["name"]
        archs.append(Arch(r["name"], r["capability"], r["aliases"], r["label"], r["engine_args"]))
    return tuple(archs)


def _modes(doc: Doc, nodes: tuple[yaml.Node, ...]) -> tuple[Mode, ...]:
    seen: dict[str, str] = {}
    modes = []
    for i, node in enumerate(nodes):
        r = doc.record(node, f"modes[{i}]", {
            "name": Field(fields.marker, "mode name, e.g. nocache"),
            "env": Field(env_vars, "environment for the engine process", required=False, default=dict),
            "engine_args": Field(engine_arguments, "vLLM engine arguments", required=False, default=dict),
            "label": Field(_LABEL, "what the mode reproduces"),
            "sanitizer": Field(sanitizer.parse, "run the engine child under compute-sanitizer (tool, flags, "
                               "prompts, max_tokens, silence)", required=False),
        })
        _unique(doc, seen, r["name"], r["@name"], "mode")
        modes.append(Mode(r["name"], r["env"], r["engine_args"], r["label"], r["sanitizer"]))
    return tuple(modes)


def _schemes(doc: Doc, nodes: tuple[yaml.Node, ...]) -> dict[str, Scheme]:
    seen: dict[str, str] = {}
    schemes: dict[str, Scheme] = {}
    for i, node in enumerate(nodes):
        r = doc.record(node, f"schemes[{i}]", {
            "name": Field(fields.name, "scheme name, e.g. nvfp4_weight_only"),
            "marker": Field(fields.marker, "marker of its cases, e.g. weight_only"),
            "label": Field(_LABEL, "human label"),
            "expect": Field(fields.expect, "default expectations of its checkpoints", required=False,
                            default=dict),
            "factory": Field(one_of(FACTORY_SCHEMES), "the factory scheme its synthetic checkpoints are built as",
                             required=False),
        })
        _unique(doc, seen, r["name"], r["@name"], "scheme")
        schemes[r["name"]] = Scheme(r["name"], r["marker"], r["label"], r["expect"], r["factory"])
    return schemes


_CHECK_FIELDS = {
    "name": Field(fields.name, "check name; suites/ must define test_<name>"),
    "kind": Field(fields.marker, "check kind marker, e.g. dispatch"),
    "tier": Field(one_of(TIERS), "cpu (runs anywhere) or gpu (needs the arch)"),
    "schemes": Field(list_of(fields.name), "schemes it applies to (default: all)", required=False),
    "producers": Field(list_of(one_of(PRODUCERS)), "producers it applies to (default: all)", required=False),
    "cells": Field(lambda d, n, w: n, "cell selectors it applies to (default: all)", required=False),
    "except_cells": Field(lambda d, n, w: n, "cell selectors it skips", required=False),
    "cpu_cells": Field(lambda d, n, w: n, "cells of a gpu-tier check that run on any host", required=False),
    "vllm": Field(list_of(one_of(VLLM_PARTS)), "parts of the vLLM under test it imports (default: none)",
                  required=False),
    "layouts": layouts.CHECK_FIELD,
    "description": Field(as_text, "what it proves"),
}


def _checks(doc: Doc, nodes: tuple[yaml.Node, ...], schemes: Mapping[str, Scheme]
            ) -> tuple[dict[str, Check], list[tuple[dict[str, Any], int]]]:
    """The checks, and the records of those whose cells are narrowed by selectors (resolved once the
    checkpoints they may name are known)."""
    seen: dict[str, str] = {}
    checks: dict[str, Check] = {}
    records = []
    for i, node in enumerate(nodes):
        r = doc.record(node, f"checks[{i}]", _CHECK_FIELDS)
        _unique(doc, seen, r["name"], r["@name"], "check")
        for s in r["schemes"] or ():
            if s not in schemes:
                raise doc.error(r["@schemes"], f"checks[{i}].schemes: unknown scheme {s!r}{closest(s, schemes)}")
        records.append((r, i))
        checks[r["name"]] = Check(r["name"], r["kind"], r["tier"], r["schemes"], r["producers"], r["description"],
                                  vllm=tuple(r["vllm"] or ()), layouts=r["layouts"])
    return checks, records


_CHECKPOINT_FIELDS = {
    "id": Field(fields.id_, "checkpoint id, e.g. qwen3moe-tiny-nvfp4-weight-only"),
    "source": Field(fields.source, "synthetic, path or hub"),
    "producer": Field(one_of(PRODUCERS), "who exported it"),
    "scheme": Field(fields.name, "one of the matrix's schemes"),
    "label": Field(_LABEL, "human label", required=False, default=""),
    "expect": Field(fields.expect, "expectations (override the scheme's)", required=False, default=dict),
    "size_gb": Field(positive, "download size in GB (10^9 bytes); absent: unknown", required=False),
    "min_gpu_memory_gb": Field(positive, "GPU memory, all of a runner's GPUs together, of the smallest setup "
                               "known to serve it; absent: unknown", required=False),
    "gpus": Field(int_at_least(1), "GPUs an engine start needs (tensor_parallel_size unless engine_args says)",
                  required=False, default=1),
    "engine_args": Field(engine_arguments, "engine arguments of this checkpoint", required=False, default=dict),
}


def _checkpoint(doc: Doc, node: yaml.Node, i: int, schemes: Mapping[str, Scheme],
                seen: dict[str, str]) -> Checkpoint:
    what = f"checkpoints[{i}]"
    r = doc.record(node, what, _CHECKPOINT_FIELDS)
    _unique(doc, seen, r["id"], r["@id"], "checkpoint id")
    for key in ("size_gb", "min_gpu_memory_gb"):
        if r[key] is not None and r["source"].kind == "synthetic":
            raise doc.error(r[f"@{key}"], f"{what}.{key}: describes a hub or path checkpoint; a synthetic one is "
                                          "built here from its spec")
    if r["size_gb"] and r["min_gpu_memory_gb"] and r["min_gpu_memory_gb"] < r["size_gb"]:
        raise doc.error(r["@min_gpu_memory_gb"], f"{what}.min_gpu_memory_gb: {r['min_gpu_memory_gb']:g} GB is "
                                                 f"less than size_gb {r['size_gb']:g}: the weights alone would not "
                                                 "fit")
    if r["scheme"] not in schemes:
        raise doc.error(r["@scheme"], f"{what}.scheme: unknown scheme {r['scheme']!r}"
                                      f"{closest(r['scheme'], schemes)}; known: {', '.join(schemes)}")
    if r["source"].kind == "synthetic":
        scheme = schemes[r["scheme"]]
        if scheme.factory is None:
            raise doc.error(r["@scheme"], f"{what}.scheme: scheme {scheme.name!r} has no `factory:` (the factory "
                                          "scheme a synthetic checkpoint of it is built as: one of "
                                          f"{', '.join(FACTORY_SCHEMES)})")
        problem = SyntheticSpec(producer=r["producer"], scheme=scheme.factory, **r["source"].value).problem()
        if problem:
            raise doc.error(r["@source"], f"{what}.source.synthetic: {problem}")
    return Checkpoint(r["id"], r["source"], r["producer"], schemes[r["scheme"]], r["expect"], r["label"],
                      doc.where(node), r["size_gb"], r["min_gpu_memory_gb"], r["gpus"], r["engine_args"])


def _checkpoints(doc: Doc, nodes: tuple[yaml.Node, ...], schemes: Mapping[str, Scheme]) -> tuple[Checkpoint, ...]:
    seen: dict[str, str] = {}
    return tuple(_checkpoint(doc, node, i, schemes, seen) for i, node in enumerate(nodes))


def _check_pinned(checkpoints: tuple[Checkpoint, ...]) -> None:
    """A branch or tag moves under the nightly: yesterday's references and today's run would test different
    weights, and JUnit could not say which. Pinning is the default; a matrix opts out by name."""
    for c in checkpoints:
        if c.source.kind == "hub" and not re.fullmatch(HUB_COMMIT, c.source.value[1]):
            repo, revision = c.source.value
            raise MatrixError(f"{c.source.where}: checkpoint {c.id!r}: revision {revision!r} of {repo} is a "
                              "floating ref (a branch or tag, `main` when absent); pin the 40-hex commit it "
                              "resolves to, or set `allow_floating_revisions: true` at the top of the matrix")


def _check_per_arch(archs: tuple[Arch, ...], schemes: Mapping[str, Scheme], checkpoints: tuple[Checkpoint, ...],
                    backends: Mapping[str, MoeBackend]) -> None:
    """A per-arch expectation names existing archs, and a pinned backend is one the matrix describes."""
    arch_keys = {n for a in archs for n in (a.name, *a.aliases)} | {"*"}
    owners = [(f"scheme {s.name}", s.expect) for s in schemes.values()]
    owners += [(f"checkpoint {c.id}", c.expect) for c in checkpoints]
    for owner, expect in owners:
        for key, value in expect.items():
            if not isinstance(value, PerArch):
                continue
            for arch_key, where in value.where.items():
                if arch_key not in arch_keys:
                    raise MatrixError(f"{where}: {owner} expect.{key}: no arch {arch_key!r}"
                                      f"{closest(arch_key, arch_keys)}")
            if key != "moe_backend":
                continue
            for arch_key, names in value.items():
                for name in names:
                    if name not in backends:
                        raise MatrixError(f"{value.where[arch_key]}: {owner} expect.moe_backend: no backend "
                                          f"{name!r} under moe_backends{closest(name, backends)}")


def _waivers(doc: Doc, sel: Selectors, nodes: tuple[yaml.Node, ...]) -> tuple[Waiver, ...]:
    out = []
    for i, node in enumerate(nodes):
        r = doc.record(node, f"waivers[{i}]", {
            "match": Field(lambda d, n, w: n, "cell selector (checkpoint, arch, mode, scheme, producer, check)"),
            "reason": Field(as_text, "why the failure is known"),
            "link": Field(as_text, "issue or PR tracking it"),
            "expires": Field(as_date, "date after which the waiver fails the run"),
        })
        out.append(Waiver(sel.one(r["match"], f"waivers[{i}].match", cell=False), r["reason"], r["link"], r["expires"],
                          doc.where(node)))
    return tuple(out)


def _build(doc: Doc, top: dict[str, Any]) -> Matrix:
    archs = _archs(doc, top["archs"])
    modes = _modes(doc, top["modes"])
    schemes = _schemes(doc, top["schemes"])
    checks, narrowed = _checks(doc, top["checks"], schemes)
    checkpoints = _checkpoints(doc, top["checkpoints"], schemes)
    if not top["allow_floating_revisions"]:
        _check_pinned(checkpoints)
    backends = moe_backends.merged(moe_backends.parse(doc, top["moe_backends"]))
    _check_per_arch(archs, schemes, checkpoints, backends)
    declared = layouts.parse(doc, top["layouts"])
    limits.check_cells(doc, top, (len(checkpoints), len(archs), len(modes), 1 + len(declared)), top["max_cells"],
                       len(top["include"]) + len(top["exclude"]))
    sel = Selectors(doc, {
        "checkpoint": [c.id for c in checkpoints],
        "arch": [n for a in archs for n in (a.name, *a.aliases)],
        "mode": [m.name for m in modes],
        "layout": layouts.names(declared, checkpoints),
        "scheme": list(schemes),
        "producer": list(PRODUCERS),
        "check": list(checks),
    })
    narrow(doc, sel, checks, narrowed)
    waivers = _waivers(doc, sel, top["waivers"])
    settings = None
    if top["e2e"] is not None:
        settings = e2e.parse(doc, top["e2e"], [m.name for m in modes])
        sanitizer.check_prompts(doc, top["modes"], modes, len(settings.prompts), settings.prompts_file)
        e2e.check_top_k(settings, [(doc.where(n), s.name, s.expect) for s, n in
                                   zip(schemes.values(), top["schemes"], strict=True)]
                        + [(c.where, c.id, c.expect) for c in checkpoints])
    matrix = Matrix(doc.path, archs, modes, schemes, checks, checkpoints, backends,
                    sel.many(top["include"], "include"), sel.many(top["exclude"], "exclude"), waivers, settings,
                    layouts.narrowed(doc, declared, sel.many))
    _check_marker_clashes(doc, top, matrix)
    return matrix


def _check_marker_clashes(doc: Doc, top: Mapping[str, Any], m: Matrix) -> None:
    """One marker name, one meaning: `-m eager` must not select both a mode and an arch alias."""
    owners: dict[str, str] = {t: "tier" for t in TIERS}
    entries = [(n, "arch", node) for a, node in zip(m.archs, top["archs"], strict=True) for n in (a.name, *a.aliases)]
    entries += [(md.name, "mode", node) for md, node in zip(m.modes, top["modes"], strict=True)]
    entries += [(lay.name, "layout", node) for lay, node in zip(m.layouts, top["layouts"], strict=True)]
    entries += [(s.marker, "scheme", node) for s, node in zip(m.schemes.values(), top["schemes"], strict=True)]
    entries += [(c.kind, "check kind", node) for c, node in zip(m.checks.values(), top["checks"], strict=True)]
    for name, owner, node in entries:
        prev = owners.setdefault(name, owner)
        if prev != owner:
            raise doc.error(node, f"marker {name!r} is used both as {prev} and as {owner}; "
                                  "`pytest -m` could not tell them apart")
