"""Cross-arch agreement: one checkpoint and mode must give the same greedy tokens on every arch, up to a near-tie.

This is how an arch-dependent bug shows even when each arch's own checks pass (the GB10 case: zeros on sm121,
plausible output on sm120). Kernels may legitimately part late in a sequence, so it is judged as the agreement
oracle judges an engine against its reference, with that oracle's code (checks.quality): at the first position
where two archs' tokens differ, each token must be within the other arch's recorded top-k. A token outside it is
red (the night fails); a near-tie flip is recorded and shown, not red. The numbers behind the rule: docs/e2e.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from quantmatrix import properties as P
from quantmatrix.checks import quality
from quantmatrix.report.model import DISAGREE, DIVERGED, CaseResult, natural


class Output(NamedTuple):
    """One case's recorded greedy output: tokens per prompt, and the top-k of each position (None: not recorded)."""

    tokens: list[list[int]] | None
    top: P.TopK | None


def output(case: CaseResult) -> Output:
    return Output(P.decode_tokens(case.prop(P.GREEDY_TOKEN_IDS)), P.decode_top_k(case.prop(P.GREEDY_TOP_K)))


def _top(out: Output, prompt: int, k: int) -> Callable[[int], list[int]]:
    top = out.top
    return (lambda j: top.at(prompt, j, k)) if top is not None else (lambda j: [])


def _rank(token: int | None, ranked: list[int], k: int) -> str:
    return str(ranked.index(token) + 1) if token in ranked else f">{k}"


def judge(ref: Output, other: Output) -> tuple[bool, str]:
    """(red, in words) for `other` against the reference output: per prompt, quality's first divergence with
    k the smaller of the two recorded top-ks. Without a recorded top-k any divergence is red; a prompt whose
    tokens end earlier on one side is red (not the same run)."""
    a, b = ref.tokens, other.tokens
    if a is None or b is None:
        return True, f"{P.GREEDY_TOKEN_IDS} is not a JSON list of lists of ints"
    if len(a) != len(b):
        return True, f"{len(b)} prompts vs {len(a)}"
    k = min(ref.top.k, other.top.k) if ref.top is not None and other.top is not None else 0
    red, ties = [], []
    for i, (sa, sb) in enumerate(zip(a, b, strict=True)):
        d = quality.parting(i, sb, sa, _top(other, i, k), _top(ref, i, k))
        if not d.diverged:
            if len(sa) != len(sb):
                red.append(f"prompt {i}: {len(sb)} tokens vs {len(sa)}")
            continue
        line = f"prompt {d.prompt} diverges at token {d.position}: {d.token} vs {d.other}"
        if not k:
            red.append(f"{line} (no top-k recorded)")
            continue
        ranks = (f" (ranks {_rank(d.token, _top(ref, i, k)(d.position), k)} and "
                 f"{_rank(d.other, _top(other, i, k)(d.position), k)} in each other's top-{k})")
        (ties if d.within_top_k else red).append(line + ranks)
    if red:
        rest = [f"{len(red) - 1} more outside the top-k"] if len(red) > 1 else []
        rest += [f"{len(ties)} near-ties"] if ties else []
        return True, red[0] + (f"; {', '.join(rest)}" if rest else "")
    if not ties:
        return False, "identical"
    return False, "near-tie: " + ties[0] + (f"; {len(ties) - 1} more near-ties" if len(ties) > 1 else "")


def agreement(cases: Iterable[CaseResult]) -> list[dict[str, Any]]:
    """Group the cases with greedy tokens; in each group that differs, the majority output (ties: the first arch
    in natural order) is the reference, and every other case is judged against it and tagged `disagree`, and
    `diverged` where that is red."""
    groups: dict[tuple[str, str, str], list[CaseResult]] = {}
    for c in cases:
        if c.outcome != "missing" and c.prop(P.GREEDY_TOKEN_IDS) is not None:
            groups.setdefault((c.checkpoint, c.mode, c.check), []).append(c)
    out = []
    for (checkpoint, mode, check), members in sorted(groups.items()):
        if len({c.prop(P.GREEDY_TOKEN_IDS) for c in members}) < 2:
            continue  # identical text: the common case, decided without parsing
        by_output: dict[str, tuple[Output, list[CaseResult]]] = {}
        for c in sorted(members, key=lambda c: natural(c.arch)):
            got = output(c)
            same = json.dumps(got.tokens) if got.tokens is not None else f"unreadable:{c.key}"
            by_output.setdefault(same, (got, []))[1].append(c)
        if len(by_output) < 2:
            continue
        ref_key, (ref_out, ref) = max(by_output.items(), key=lambda kv: len(kv[1][1]))
        differs = []
        for key, (_, group) in by_output.items():
            for c in group if key != ref_key else ():
                # each case's own top-k: cases of one output may differ in what they ranked
                red, detail = judge(ref_out, output(c))
                c.tag(DISAGREE)
                if red:
                    c.tag(DIVERGED)
                differs.append({"arch": c.arch, "device": c.prop(P.DEVICE_NAME, ""), "case": c.key,
                                "red": red, "detail": detail})
        reference = [{"arch": c.arch, "device": c.prop(P.DEVICE_NAME, ""), "case": c.key} for c in ref]
        out.append({"checkpoint": checkpoint, "mode": mode, "check": check,
                    "red": any(x["red"] for x in differs), "differs": differs, "reference": reference})
    return out


def _who(entry: Mapping[str, str]) -> str:
    return f"{entry['arch']} ({entry['device']})" if entry["device"] else entry["arch"]


def describe_disagreement(d: Mapping[str, Any]) -> str:
    """One line a maintainer can read: 'sm121 (NVIDIA GB10) differs from sm120 (RTX PRO 6000): ...'."""
    ref = ", ".join(_who(r) for r in d["reference"])
    return f"{d['checkpoint']} / {d['mode']} / {d['check']}: " + "; ".join(
        f"{_who(x)} differs from {ref}: {x['detail']}" for x in d["differs"])
