"""Expected findings against found ones, the one comparison the lint and the audit verdicts share: a code
expected anywhere, or a code pinned to tensors (schema.model.TensorFinding: three planted faults of one kind are
three findings, each where it was planted, not one code)."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from quantmatrix.schema.model import TensorFinding

F = TypeVar("F")


def unmatched(expected: Iterable[str | TensorFinding], found: Sequence[F], code: Callable[[F], str],
              names: Callable[[F], Iterable[str]]) -> tuple[list[str], list[TensorFinding], list[F]]:
    """(expected codes no finding has, pins with no finding of their code on a tensor their glob names, findings
    that neither an expected code nor a pin accounts for). `names` gives the full tensor names a finding stands
    for; a pin's glob must match one of them."""
    expected = tuple(expected)
    codes = {e for e in expected if isinstance(e, str)}
    pinned = [e for e in expected if isinstance(e, TensorFinding)]

    def at(f: F, e: TensorFinding) -> bool:
        return code(f) == e.code and any(fnmatch.fnmatchcase(n, e.tensor) for n in names(f))

    missing = sorted(codes - {code(f) for f in found})
    unfound = [e for e in pinned if not any(at(f, e) for f in found)]
    extra = [f for f in found if code(f) not in codes and not any(at(f, e) for e in pinned)]
    return missing, unfound, extra


def describe(expected: Iterable[str | TensorFinding]) -> str:
    """Expected items in the matrix's words: `zero`, `zero on <glob>`."""
    return ", ".join(e if isinstance(e, str) else f"{e.code} on {e.tensor}" for e in expected)
