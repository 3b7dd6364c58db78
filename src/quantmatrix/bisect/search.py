"""The binary search, over any ordered candidates and any way of testing one (pure: no installs, no I/O).

Both ends are tested first and must show the stated verdicts. The search then keeps the invariant "the lower
end has the old verdict, the upper end the new one" and names the first candidate with the new verdict. A
candidate that gives no verdict (its install failed, its case errored) is skipped like `git bisect skip`: the
next-closest to the middle is tried instead, and if only skipped ones remain between the ends, the answer is a
range that names them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from quantmatrix.bisect.check import BAD, GOOD, SKIP, Outcome

V = TypeVar("V")


@dataclasses.dataclass
class Found(Generic[V]):
    """Where the verdict changed: `last_old` has the old verdict, `first_new` the new one, and `untestable` are
    the candidates between them that gave none (empty: `first_new` is exactly the first changed one)."""

    status: str  # found | ambiguous | endpoints (an end did not show its stated verdict)
    last_old: V | None
    first_new: V | None
    untestable: list[V]
    outcomes: dict[V, Outcome]
    problem: str = ""


def _closest(inner: Sequence[int], mid: float) -> int:
    return min(inner, key=lambda i: (abs(i - mid), i))


def search(candidates: Sequence[V], old: str, test: Callable[[V], Outcome],
           known: dict[V, Outcome] | None = None) -> Found[V]:
    """First candidate (ascending) whose verdict is not `old`, where candidates[0] must be `old` and
    candidates[-1] the other verdict. `known` outcomes are not tested again."""
    new = BAD if old == GOOD else GOOD
    outcomes: dict[V, Outcome] = dict(known or {})

    def outcome(v: V) -> Outcome:
        if v not in outcomes:
            outcomes[v] = test(v)
        return outcomes[v]

    lo, hi = 0, len(candidates) - 1
    for index, want in ((hi, new), (lo, old)):  # the stated-bad end first: it is the one a maintainer doubts
        got = outcome(candidates[index])
        if got.verdict != want:
            what = "gives no verdict" if got.verdict == SKIP else f"is {got.verdict}"
            return Found("endpoints", None, None, [], outcomes,
                         f"{candidates[index]} was stated {want} but {what} ({got.outcome}: {got.message})")
    skipped: set[int] = set()
    while inner := [i for i in range(lo + 1, hi) if i not in skipped]:
        i = _closest(inner, (lo + hi) / 2)
        got = outcome(candidates[i])
        if got.verdict == SKIP:
            skipped.add(i)
        elif got.verdict == old:
            lo = i
        else:
            hi = i
    untestable = [candidates[i] for i in range(lo + 1, hi)]
    return Found("ambiguous" if untestable else "found", candidates[lo], candidates[hi], untestable, outcomes)
