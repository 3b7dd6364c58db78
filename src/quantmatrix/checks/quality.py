"""Quality oracles of the e2e tier: is the engine's greedy output text at all (degeneration), the reference's
text (agreement), the same in every mode (invariance), and as accurate as it was (task accuracy)?

Each oracle is a pure function of data (token ids, top-k logprobs, counts) with thresholds from the matrix;
each verdict says the cell, what the engine routed the experts to, and the numbers that decided.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

# ------------------------------------------------------------------------------------------ degeneration


@dataclasses.dataclass(frozen=True)
class Degeneration:
    """Statistics of a set of greedy continuations; the seed bug's output (one token repeated) maxes all."""

    max_repeat_run: int
    worst_prompt: int
    distinct_1: float
    distinct_2: float
    compression_ratio: float

    def crossed(self, limits: dict[str, Any]) -> list[str]:
        """Every threshold crossed, in words with both numbers."""
        out = []
        if self.max_repeat_run > limits["max_repeat_run"]:
            out.append(f"one token repeated {self.max_repeat_run} times in a row (prompt {self.worst_prompt}) "
                       f"> max_repeat_run {limits['max_repeat_run']}")
        if self.distinct_1 < limits["min_distinct_1"]:
            out.append(f"distinct-1 {self.distinct_1:.3f} < min_distinct_1 {limits['min_distinct_1']}")
        if self.distinct_2 < limits["min_distinct_2"]:
            out.append(f"distinct-2 {self.distinct_2:.3f} < min_distinct_2 {limits['min_distinct_2']}")
        if self.compression_ratio > limits["max_compression_ratio"]:
            out.append(f"compression ratio {self.compression_ratio:.2f} > max_compression_ratio "
                       f"{limits['max_compression_ratio']}")
        return out

    def summary(self) -> str:
        return (f"max_repeat_run {self.max_repeat_run}, distinct-1 {self.distinct_1:.3f}, distinct-2 "
                f"{self.distinct_2:.3f}, compression ratio {self.compression_ratio:.2f}")


def longest_run(tokens: Sequence[int]) -> int:
    best = run = 0
    prev = None
    for t in tokens:
        run = run + 1 if t == prev else 1
        prev = t
        best = max(best, run)
    return best


def _distinct(seqs: Sequence[Sequence[int]], n: int) -> float:
    grams = [tuple(s[i:i + n]) for s in seqs for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def compression_ratio(seqs: Sequence[Sequence[int]]) -> float:
    """Raw / zlib size of the token stream (4 bytes a token): ~1 for varied text, large for loops."""
    raw = b"".join(t.to_bytes(4, "little") for s in seqs for t in s)
    return len(raw) / len(zlib.compress(raw, 9)) if raw else 0.0


def degeneration(seqs: Sequence[Sequence[int]]) -> Degeneration:
    runs = [longest_run(s) for s in seqs]
    worst = max(range(len(runs)), key=runs.__getitem__) if runs else 0
    return Degeneration(max(runs, default=0), worst, _distinct(seqs, 1), _distinct(seqs, 2),
                        compression_ratio(seqs))


# ------------------------------------------------------------------------------------- agreement (logprobs)


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Where two greedy continuations of one prompt part, and whether the parting is a near-tie."""

    prompt: int
    position: int  # first position whose tokens differ; == length when they never do
    length: int
    token: int | None  # this run's token there
    other: int | None  # the other run's token there
    within_top_k: bool  # each token is in the other's top-k at that position

    @property
    def diverged(self) -> bool:
        return self.position < self.length


def top_k(logprobs: dict[str, float | None], k: int) -> list[int]:
    """The k most likely tokens of one position (a None logprob, i.e. NaN or inf, is never among them)."""
    ranked = sorted(((lp, int(tok)) for tok, lp in logprobs.items() if lp is not None), key=lambda x: -x[0])
    return [tok for _, tok in ranked[:k]]


def first_divergence(prompt: int, ours: dict[str, Any], theirs: dict[str, Any], k: int) -> Divergence:
    """vLLM's check_logprobs_close, for one prompt: walk both greedy sequences; at the first position where the
    tokens differ, each must be in the other's top-k there; after it the sequences are not comparable."""
    return parting(prompt, ours["token_ids"], theirs["token_ids"], lambda i: top_k(ours["logprobs"][i], k),
                   lambda i: top_k(theirs["logprobs"][i], k))


def parting(prompt: int, ours: Sequence[int], theirs: Sequence[int], ours_top: Callable[[int], Sequence[int]],
            theirs_top: Callable[[int], Sequence[int]]) -> Divergence:
    """first_divergence on bare token ids, each side's top-k at a position given by a function (a run's logprobs,
    or the ranked ids a JUnit file recorded: report.crossarch): only the first differing position is ranked."""
    n = min(len(ours), len(theirs))
    for i in range(n):
        if ours[i] != theirs[i]:
            return Divergence(prompt, i, n, ours[i], theirs[i], ours[i] in theirs_top(i) and theirs[i] in ours_top(i))
    return Divergence(prompt, n, n, None, None, True)


def compare(ours: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]], k: int) -> list[Divergence]:
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} continuations against {len(theirs)}: not the same prompt set")
    return [first_divergence(i, a, b, k) for i, (a, b) in enumerate(zip(ours, theirs, strict=True))]


def exact(ours: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]]) -> list[Divergence]:
    """Token-for-token equality (k = 0): any difference fails."""
    return [dataclasses.replace(d, within_top_k=not d.diverged) for d in compare(ours, theirs, 1)]


def prompt_mismatch(ours: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]]) -> str | None:
    """Two runs are comparable only on the same prompt tokens."""
    if len(ours) != len(theirs):
        return f"{len(ours)} prompts here, {len(theirs)} there"
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a["prompt_token_ids"] != b["prompt_token_ids"]:
            return f"prompt {i} tokenizes to {a['prompt_token_ids']} here, {b['prompt_token_ids']} there"
    return None


def describe(divs: Sequence[Divergence]) -> str:
    """Per prompt: where it diverged and how (ok = a top-k near-tie)."""
    rows = []
    for d in divs:
        if not d.diverged:
            rows.append(f"  prompt {d.prompt}: identical over {d.length} tokens")
        else:
            rows.append(f"  prompt {d.prompt}: first divergence at position {d.position}: {d.token} here vs "
                        f"{d.other} there ({'within' if d.within_top_k else 'NOT within'} each other's top-k)")
    return "\n".join(rows)


# -------------------------------------------------------------------------------------------- accuracy


def wilson_interval(correct: int, n: int, z: float) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion: honest at small n and at 0 or n successes."""
    if n <= 0:
        raise ValueError("a Wilson interval needs at least one trial")
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclasses.dataclass(frozen=True)
class AccuracyVerdict:
    correct: int
    n: int
    reference_correct: int
    reference_n: int
    z: float
    max_drop: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.n

    @property
    def bound(self) -> float:
        """Pass line: the reference accuracy's Wilson lower bound, minus the stated tolerance."""
        return wilson_interval(self.reference_correct, self.reference_n, self.z)[0] - self.max_drop

    @property
    def ok(self) -> bool:
        return self.accuracy >= self.bound

    def arithmetic(self) -> str:
        low, high = wilson_interval(self.reference_correct, self.reference_n, self.z)
        return (f"accuracy {self.correct}/{self.n} = {self.accuracy:.3f}; reference {self.reference_correct}/"
                f"{self.reference_n} = {self.reference_correct / self.reference_n:.3f}, Wilson interval "
                f"(z={self.z}) [{low:.3f}, {high:.3f}]; pass line = lower bound {low:.3f} - max_drop "
                f"{self.max_drop} = {self.bound:.3f}")


def score(completions: Sequence[str], answers: Sequence[str]) -> list[bool]:
    """A task is solved when the continuation's first non-blank line starts with the answer."""
    out = []
    for text, answer in zip(completions, answers, strict=True):
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        out.append(first.startswith(answer.strip()))
    return out
