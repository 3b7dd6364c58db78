"""What a load left in one backend's layers, as data: each Finding (a tensor, its role, what is wrong, which expert
rows) and the AuditReport of a layer or model. Measured by measure.findings (values) from the masks measure.sentinel
and the guard take; judged by checks.audit. No torch here, so a verdict module can name these types for free."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class Finding:
    param: str
    role: str
    kind: str  # unloaded | nonfinite | zero | negative | refused (the loader raised) | varies | misplaced (off the
    # reference split of a parallel layout: the guard's per-call check)
    experts: tuple[int, ...]  # affected expert rows (empty: not an expert-indexed tensor)
    read: bool  # does the selected backend read this tensor?
    detail: str = ""
    rank: int | None = None  # the rank that loaded it, under a parallel layout (experts are then global ids)

    def describe(self) -> str:
        where = f" [expert{'s' if len(self.experts) > 1 else ''} {ranges(self.experts)}]" if self.experts else ""
        on = f"rank {self.rank} " if self.rank is not None else ""
        return f"{on}{self.param}{where}: {self.kind}{' (' + self.detail + ')' if self.detail else ''}"


@dataclasses.dataclass(frozen=True)
class AuditReport:
    backend: str
    reads: frozenset[str]
    findings: tuple[Finding, ...]
    loaded: frozenset[str]

    @property
    def read_but_unloaded(self) -> list[Finding]:
        return [f for f in self.findings if f.read and f.kind == "unloaded"]

    @property
    def unusable(self) -> list[Finding]:
        """Loaded with values no kernel can use, refused by vLLM's loader (loud, but the checkpoint is broken), or
        written off the rank's reference split (the guard)."""
        return [f for f in self.findings
                if f.read and f.kind in ("nonfinite", "zero", "negative", "refused", "misplaced")]

    @property
    def notes(self) -> list[Finding]:
        """Recorded, not failed: created-but-unread tensors (input_scale under Marlin), per-expert spreads."""
        return [f for f in self.findings if f not in self.read_but_unloaded and f not in self.unusable]


def ranges(rows: Iterable[int]) -> str:
    rows = sorted(rows)
    out, start = [], None
    for i, r in enumerate(rows):
        if start is None:
            start = r
        if i + 1 == len(rows) or rows[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(out)
