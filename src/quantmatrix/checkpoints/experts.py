"""The lint's expert checks: experts counted as vLLM names them, against config.json's count, and every expert
projection's shape against the config's sizes. vLLM builds the name of expert `e` as `experts.{e}.` (ASCII decimal,
no leading zero), so `experts.01.` or `experts.٣.` is a tensor it never loads, and a half-size expert is one its
loader refuses or misreads: each is a finding here, never a silent OK. Findings are (code, module, tensor, message)
tuples, which checkpoints.lint turns into its Findings. Work is linear in the number of modules."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from quantmatrix.checkpoints.untrusted import LintError

MAX_EXPERTS = 65536  # a config claiming more is refused, not expanded into a finding per expert
EXPERT_FINDINGS = 16  # missing experts of one projection listed one by one; beyond that, summarised
MAX_PROJECTIONS = 64  # distinct projection names under one layer's experts (a real expert has three)
COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
_INDEX = re.compile(r"0|[1-9][0-9]*")  # how vLLM writes an expert id
# Each projection's (rows, columns) in config sizes: gate/up (w1/w3) map hidden -> expert ffn, down (w2) back.
_PROJ_SHAPE = {"gate_proj": ("ffn", "hidden"), "up_proj": ("ffn", "hidden"), "w1": ("ffn", "hidden"),
               "w3": ("ffn", "hidden"), "down_proj": ("hidden", "ffn"), "w2": ("hidden", "ffn")}
Found = tuple[str, str, str, str]


def count(config: Mapping[str, Any], where: Path) -> int:
    """config.json's expert count (0 when it names none); a value that is not a small integer is a LintError."""
    n = next((config[k] for k in COUNT_KEYS if config.get(k)), 0)
    if type(n) is not int or not 0 <= n <= MAX_EXPERTS:
        raise LintError(f"{where}: num_experts {str(n)[:40]} is not an integer from 0 to {MAX_EXPERTS}")
    return n


def _sizes(config: Mapping[str, Any], where: Path) -> dict[str, int] | None:
    """hidden and expert ffn sizes, type-checked; None when the config states either not at all."""
    hidden = config.get("hidden_size")
    ffn_key = "moe_intermediate_size" if "moe_intermediate_size" in config else "intermediate_size"
    ffn = config.get(ffn_key)
    if hidden is None or ffn is None:
        return None
    for key, value in (("hidden_size", hidden), (ffn_key, ffn)):
        if type(value) is not int or value <= 0:
            raise LintError(f"{where}: {key} {str(value)[:40]} is not a positive integer")
    return {"hidden": hidden, "ffn": ffn}


def _layers(modules: Mapping[str, Any]) -> tuple[dict[str, dict[int, set[str]]], list[Found]]:
    """{layer head: {expert: projections}} for expert modules named as vLLM names them; a finding for each
    expert module whose index vLLM would never produce."""
    layers: dict[str, dict[int, set[str]]] = {}
    out = []
    for module in modules:
        head, sep, tail = module.rpartition(".experts.")
        idx, _, proj = tail.partition(".")
        if not sep or not proj:
            continue
        if _INDEX.fullmatch(idx):
            layers.setdefault(head, {}).setdefault(int(idx), set()).add(proj)
        elif idx and (idx.isdigit() or idx.isdecimal() or idx.isnumeric()):
            out.append(("unexpected_tensor", module, "", f"expert index {idx!r} is not how vLLM names an expert "
                        "(ASCII decimal, no leading zero): its tensors are never loaded"))
    return layers, out


def _missing(have: set[int], n: int) -> tuple[list[int], int, int]:
    """(the first EXPERT_FINDINGS missing experts below n, how many are missing, the last missing) without
    walking all n when few are present."""
    present = sum(1 for e in have if e < n)
    first = []
    e = 0
    while len(first) < EXPERT_FINDINGS and e < n:
        if e not in have:
            first.append(e)
        e += 1
    last = next((e for e in range(n - 1, -1, -1) if e not in have), -1)
    return first, n - present, last


def _expert_findings(head: str, experts: dict[int, set[str]], n: int, where: Path) -> Iterator[Found]:
    projs = set().union(*experts.values())
    if len(projs) > MAX_PROJECTIONS:
        raise LintError(f"{where}: {head} has {len(projs)} distinct projection names under its experts, over the "
                        f"{MAX_PROJECTIONS} this lint checks (a real expert has a few)")
    beyond = sorted(e for e in experts if e >= n) if n else []  # no count: the model class's default applies
    if beyond:
        yield ("unexpected_tensor", f"{head}.experts.{beyond[0]}", "", f"{len(beyond)} expert(s) from {beyond[0]} "
               f"to {beyond[-1]}, but config.json says {n} experts: vLLM never loads them")
    for proj in sorted(projs):
        first, total, last = _missing({e for e, p in experts.items() if proj in p}, n)
        for e in first:
            yield ("missing_tensor", f"{head}.experts.{e}.{proj}", "", f"no tensors at all; config.json says {n} "
                   f"experts and siblings have {proj}")
        if total > len(first):
            yield ("missing_tensor", f"{head}.experts.*.{proj}", "", f"and {total - len(first)} more experts "
                   f"(up to {last}) have no {proj} either")


def _shape_findings(modules: Mapping[str, Mapping[str, Any]], sizes: dict[str, int]) -> Iterator[Found]:
    """Each expert projection's weight against the config: rows x columns (packed e2m1 U8 holds two per byte)."""
    for module, leaves in modules.items():
        head, sep, tail = module.rpartition(".experts.")
        proj = tail.partition(".")[2]
        w = leaves.get("weight")
        if not sep or proj not in _PROJ_SHAPE or w is None or len(w.shape) != 2:
            continue
        rows, cols = (sizes[k] for k in _PROJ_SHAPE[proj])
        got = (w.shape[0], w.shape[1] * 2) if w.dtype == "U8" else tuple(w.shape)
        if got != (rows, cols):
            packed = " (packed: two e2m1 values a byte)" if w.dtype == "U8" else ""
            yield ("bad_shape", module, "weight", f"is {list(w.shape)}{packed}, {got[0]} x {got[1]}; config.json "
                   f"sizes make {proj} {rows} x {cols}")


def check(modules: Mapping[str, Mapping[str, Any]], config: Mapping[str, Any], where: Path) -> list[Found]:
    """Every expert of every MoE layer named as vLLM names it, within config.json's count, with the projections
    its siblings have and the shapes the config's sizes give."""
    n = count(config, where)
    layers, out = _layers(modules)
    for head, experts in layers.items():
        out += _expert_findings(head, experts, n, where)
    sizes = _sizes(config, where)
    if sizes is not None:
        out += _shape_findings(modules, sizes)
    return out
