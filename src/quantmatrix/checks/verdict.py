"""The one result type of every check: the plugin's judge records its properties, then fails or skips the case
with its words."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Verdict:
    """problem: the case fails with it; skip: not evaluated, and why; properties: JUnit per-case facts."""

    problem: str | None = None
    skip: str | None = None
    properties: list[tuple[str, Any]] = dataclasses.field(default_factory=list)
