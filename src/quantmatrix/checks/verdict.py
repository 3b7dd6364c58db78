"""The one result type of every check, and the one shape of a check: a function from a case and what was measured
for it to a Verdict. The plugin's judge records the verdict's properties, then passes, fails or skips the case.

A failure's message always starts with the same heading, `<cell id> <check>: `, whatever the check, so a reader
of a night's report (or of a terminal) knows at once which cell and which check spoke.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, Protocol

from quantmatrix.schema.model import Case

OK, FAIL, SKIP = "ok", "fail", "skip"
Properties = Iterable[tuple[str, Any]]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """`problem`: what is wrong (fail only), without the heading; `reason`: why the case was not evaluated (skip
    only); `properties`: the JUnit facts the check recorded, whatever the outcome."""

    outcome: str
    heading: str = ""
    problem: str | None = None
    reason: str | None = None
    properties: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def ok(cls, properties: Properties = ()) -> Verdict:
        return cls(OK, properties=tuple(properties))

    @classmethod
    def fail(cls, case: Case, problem: str, properties: Properties = ()) -> Verdict:
        return cls(FAIL, heading(case), problem, properties=tuple(properties))

    @classmethod
    def skip(cls, reason: str, properties: Properties = ()) -> Verdict:
        return cls(SKIP, reason=reason, properties=tuple(properties))

    @classmethod
    def of(cls, case: Case, problem: str | None, properties: Properties = ()) -> Verdict:
        """ok when there is no problem, else fail with it: the common end of a check."""
        return cls.ok(properties) if problem is None else cls.fail(case, problem, properties)

    @property
    def message(self) -> str:
        """The words the case fails (heading and problem) or skips with; "" for ok."""
        if self.outcome == FAIL:
            return f"{self.heading}: {self.problem}"
        return self.reason or ""


def heading(case: Case) -> str:
    """`qwen3moe-tiny-nvfp4-weight-only@sm121-default config_dispatch`: the cell, then the check."""
    return f"{case.cell.id} {case.check.name}"


class Check(Protocol):
    """Every check of suites/: a case and its measurements in, a Verdict out; no side effects, no pytest."""

    def __call__(self, case: Case, /, *measured: Any) -> Verdict: ...
