"""Lost coverage stays red until someone acknowledges it: a case that was tested once and is now skipped, missing,
not run or on an arch nobody provisions any more is red every night, however long ago it last ran, until a live
waiver covers it or the matrix no longer defines it.

Two facts decide: when the case last ran (its `tested` night, carried in summary.json for as long as the case is,
beyond the history window), and what tonight's matrices define (each JUnit file's MATRIX_CASES record, written
by the plugin: every case of the matrix, whatever the run selected, and the cases of each live waiver).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from quantmatrix import properties as P
from quantmatrix.report.model import RAN, CaseResult


def last_tested(case: Mapping[str, Any], nights: list[dict[str, str]], night: str) -> str:
    """The night a previous summary's case last ran: its `tested`, else the newest night of its history in which
    it ran (a summary written before `tested` existed), else "" (never, as far as anyone knows). `night` is the
    night of that summary, `nights` the ones its history is aligned with."""
    tested = case.get("tested")
    if isinstance(tested, str) and tested:
        return tested
    if case["outcome"] in RAN:
        return night
    for i, entry in enumerate(case.get("history", "").split()):
        if entry.partition("@")[0] in RAN and i < len(nights):
            return nights[i]["night"]
    return ""


def waiver_live(props: Mapping[str, str], today: datetime.date) -> bool:
    """The case carries a waiver that has not expired on `today`."""
    if P.WAIVER_REASON not in props or props.get(P.WAIVER_EXPIRED) == "true":
        return False
    try:
        return today <= datetime.date.fromisoformat(props.get(P.WAIVER_EXPIRES, ""))
    except ValueError:
        return False


def case_id(c: CaseResult) -> str:
    """`check[cell]`, as MATRIX_CASES names a case."""
    return f"{c.check}[{c.checkpoint}@{c.arch}-{c.mode}]"


@dataclasses.dataclass
class Defined:
    """What tonight's matrices define, merged from every file that carries a MATRIX_CASES record, by matrix."""

    matrices: dict[str, list[P.MatrixCases]] = dataclasses.field(default_factory=dict)

    def add(self, record: P.MatrixCases | None) -> None:
        if record is not None:
            self.matrices.setdefault(record.matrix, []).append(record)

    def knows(self, c: CaseResult) -> bool:
        """The case's matrix ran tonight, so its record says what the matrix defines and waives."""
        return bool(self.matrices.get(c.prop(P.MATRIX) or ""))

    def removed(self, c: CaseResult) -> bool:
        """Its matrix ran tonight and no longer defines it: a change in the matrix, not a loss."""
        records = self.matrices.get(c.prop(P.MATRIX) or "")
        return bool(records) and not any(r.defines(c.check, f"{c.checkpoint}@{c.arch}-{c.mode}") for r in records)

    def waiver(self, c: CaseResult) -> dict[str, str] | None:
        """The live waiver tonight's matrix has for a case that sent no result."""
        for r in self.matrices.get(c.prop(P.MATRIX) or "", ()):
            found = r.waiver(case_id(c))
            if found is not None:
                return found
        return None


def waiver_properties(waiver: Mapping[str, str]) -> dict[str, str]:
    return {P.WAIVER_REASON: waiver["reason"], P.WAIVER_LINK: waiver["link"], P.WAIVER_EXPIRES: waiver["expires"],
            P.WAIVER_EXPIRED: "false"}


def untested_message(c: CaseResult, tested: str, provisioned: Iterable[str] | None) -> str:
    """Why a case that ran once counts as lost tonight, for its line in the report."""
    where = "" if provisioned is None or c.arch in provisioned else f"; {c.arch} is not provisioned"
    return f"tested last on {tested}, not since{where}: red until it runs again, a waiver covers it or the " \
           "matrix drops it"
