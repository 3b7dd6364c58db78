"""Cross-arch agreement: one checkpoint, mode and check must give the same greedy tokens on every arch.

This is how an arch-dependent bug shows even when each arch's own checks pass (the GB10 case: zeros on
sm121, plausible output on sm120).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from quantmatrix.report.model import CaseResult, natural


def _tokens(raw: str) -> list[list[int]] | None:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if isinstance(value, list) and all(isinstance(s, list) and all(type(t) is int for t in s) for s in value):
        return value
    return None


def _divergence(a: list[list[int]] | None, b: list[list[int]] | None) -> str:
    if a is None or b is None:
        return "greedy_token_ids is not a JSON list of lists of ints"
    if len(a) != len(b):
        return f"{len(b)} prompts vs {len(a)}"
    for i, (sa, sb) in enumerate(zip(a, b, strict=True)):
        j = next((j for j, (ta, tb) in enumerate(zip(sa, sb, strict=False)) if ta != tb), None)
        if j is not None:
            return f"prompt {i} diverges at token {j}: {sb[j]} vs {sa[j]}"
        if len(sa) != len(sb):
            return f"prompt {i}: {len(sb)} tokens vs {len(sa)}"
    return "outputs differ"


def agreement(cases: Iterable[CaseResult]) -> list[dict[str, Any]]:
    """Group the cases with greedy tokens; in each group that differs, the majority output is the reference
    and every other case is tagged `disagree`."""
    groups: dict[tuple[str, str, str], list[CaseResult]] = {}
    for c in cases:
        if c.outcome != "missing" and c.prop("greedy_token_ids") is not None:
            groups.setdefault((c.checkpoint, c.mode, c.check), []).append(c)
    out = []
    for (checkpoint, mode, check), members in sorted(groups.items()):
        if len({c.prop("greedy_token_ids") for c in members}) < 2:
            continue  # identical text: the common case, decided without parsing
        by_output: dict[str, tuple[list[list[int]] | None, list[CaseResult]]] = {}
        for c in sorted(members, key=lambda c: natural(c.arch)):
            tokens = _tokens(c.prop("greedy_token_ids") or "")
            same = json.dumps(tokens) if tokens is not None else f"unreadable:{c.key}"
            by_output.setdefault(same, (tokens, []))[1].append(c)
        if len(by_output) < 2:
            continue
        ref_key, (ref_tokens, ref) = max(by_output.items(), key=lambda kv: len(kv[1][1]))
        differs = []
        for k, (tokens, group) in by_output.items():
            for c in group if k != ref_key else ():
                c.tag("disagree")
                differs.append({"arch": c.arch, "device": c.prop("device_name", ""), "case": c.key,
                                "detail": _divergence(ref_tokens, tokens)})
        reference = [{"arch": c.arch, "device": c.prop("device_name", ""), "case": c.key} for c in ref]
        out.append({"checkpoint": checkpoint, "mode": mode, "check": check, "differs": differs,
                    "reference": reference})
    return out


def _who(entry: Mapping[str, str]) -> str:
    return f"{entry['arch']} ({entry['device']})" if entry["device"] else entry["arch"]


def describe_disagreement(d: Mapping[str, Any]) -> str:
    """One line a maintainer can read: 'sm121 (NVIDIA GB10) differs from sm120 (RTX PRO 6000): ...'."""
    ref = ", ".join(_who(r) for r in d["reference"])
    return f"{d['checkpoint']} / {d['mode']} / {d['check']}: " + "; ".join(
        f"{_who(x)} differs from {ref}: {x['detail']}" for x in d["differs"])
