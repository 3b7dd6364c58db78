"""What a night recorded of a case, read back from its JUnit file(s) or from the report's summary.json: the
outcome, the failure message and log tail, and every property the plugin and the check wrote (the cell, the
vLLM under test, what was measured). A bundle is made from this and the matrix, nothing else."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from quantmatrix import properties as P
from quantmatrix.errors import ReportError, ReproError
from quantmatrix.report import read
from quantmatrix.report.diff import load_previous
from quantmatrix.report.keys import node_id, report_key
from quantmatrix.report.model import RED


@dataclasses.dataclass(frozen=True)
class Record:
    key: str  # the report's spelling (suites.test_x::test_y[CELL])
    outcome: str
    message: str
    log_tail: str
    props: dict[str, str]  # the case's own properties and those its file's cases share
    suite: dict[str, str]  # its JUnit file's testsuite properties (matrix, run id, vLLM health, ...)
    source: str  # the file it was read from

    @property
    def nodeid(self) -> str:
        return node_id(self.key)

    @property
    def red(self) -> bool:
        return self.outcome in RED

    def prop(self, name: str, default: str = "") -> str:
        return self.props.get(name) or self.suite.get(name) or default


def from_junit(paths: list[str]) -> list[Record]:
    """Every case of the JUnit files (a run directory is searched for *.xml); a later file's entry for a case
    replaces an earlier one (a rerun); an unreadable file is a ReproError naming it."""
    files, bad = read.find_inputs(paths)
    if bad:
        raise ReproError(f"{bad[0]['path']}: {bad[0]['problem']}")
    out: dict[str, Record] = {}
    for path in files:
        f = read.read_file(path)
        if f.problem:
            raise ReproError(f"{path}: {f.problem}")
        for row in f.rows:
            earlier = out.get(row.key)
            red_first = earlier is not None and earlier.source == path and earlier.red
            if not red_first:  # pytest writes a failure and a teardown error as two entries of one case
                out[row.key] = Record(row.key, row.outcome, row.message, row.log_tail, {**f.common, **row.props},
                                      f.properties, path)
    return list(out.values())


def from_summary(path: Path) -> list[Record]:
    """Every case of a report's summary.json, with its file's shared and testsuite properties."""
    try:
        prev = load_previous(path)
    except ReportError as e:
        raise ReproError(str(e)) from None
    out = []
    for key, case in prev.cases.items():
        f = case.get("file")
        suite = prev.inputs[f]["properties"] if f is not None else {}
        out.append(Record(key, case["outcome"], case.get("message", ""), case.get("log_tail", ""),
                          prev.props(case), dict(suite), str(path)))
    return out


def find(records: list[Record], case_id: str) -> Record:
    key = report_key(case_id)
    for r in records:
        if r.key == key:
            return r
    sources = sorted({r.source for r in records}) or ["no case at all"]
    raise ReproError(f"no case {key!r} in {', '.join(sources)} (`quantmatrix list` names the cases)")


def new_failures(records: list[Record], previous: Path | None) -> list[Record]:
    """The red records; with last night's summary.json, only those that were not already red then."""
    red = [r for r in records if r.red]
    if previous is None:
        return red
    try:
        before = json.loads(previous.read_text(encoding="utf-8")).get("cases", {})
    except (OSError, ValueError, AttributeError) as e:
        raise ReproError(f"{previous}: cannot read the previous summary: {e}") from None
    return [r for r in red if (before.get(r.key) or {}).get("outcome") not in RED]


def vllm_of(record: Record) -> dict[str, str]:
    """The vLLM under test as the case's run recorded it."""
    return {name: record.prop(name, "unknown") for name in (P.VLLM_VERSION, P.VLLM_DISTRIBUTION, P.VLLM_COMMIT,
                                                             P.VLLM_WHEEL, P.TORCH_VERSION, P.PLATFORM)}
