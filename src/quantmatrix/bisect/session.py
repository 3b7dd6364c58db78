"""One bisect: list the candidates, test them through cached venvs, search, narrow to commits, write the record.

Progress goes to `say` as it happens (which release is being installed or tested, seconds since the start),
because a cold bisect of real releases takes many minutes and a silent one looks hung.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.version import Version

from quantmatrix.adapter.versions import BREAKS_IMPORT
from quantmatrix.atomic import dump_json, write_atomic
from quantmatrix.bisect import candidates as cand
from quantmatrix.bisect.check import BAD, GOOD, SKIP, Outcome, node_id, require_case, run_case
from quantmatrix.bisect.repack import repack
from quantmatrix.bisect.search import Found, search
from quantmatrix.bisect.venvs import InstallFailed, Recipe, Sources, VenvCache
from quantmatrix.errors import BisectError

DEFAULT_INDEX = "https://pypi.org/simple"


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything one bisect needs; the CLI fills it from arguments, the tests from a fake index."""

    case_id: str
    package: str
    good: Version
    bad: Version
    root: Path  # the checkout whose suites/ hold the case
    sources: Sources
    recipe: Recipe
    record: Path
    log: Path
    wheels: Path | None = None
    commit_index: str | None = None
    timeout_s: float = 1800.0
    pytest_args: tuple[str, ...] = ()


def default_recipe(package: str, work: Path) -> Recipe:
    """quantmatrix's own runtime requirements resolved with the release, quantmatrix itself (this install,
    repacked into `work`) without dependencies: it never chooses the vLLM or torch under test."""
    reqs = [Requirement(r) for r in importlib.metadata.requires("quantmatrix") or ()]
    plain = tuple(str(r) for r in reqs if not (r.marker and "extra" in str(r.marker)))
    return Recipe(plain, BREAKS_IMPORT.get(package, ()), (repack("quantmatrix", work),))


class Bisect:
    """One run: `run()` returns the record (also written to plan.record) and the exit code."""

    def __init__(self, plan: Plan, cache: VenvCache, say: Callable[[str], None] | None = None) -> None:
        self.plan, self.cache = plan, cache
        self._say = say or (lambda line: print(line, flush=True))
        self.start = time.monotonic()
        self.tested: list[dict[str, Any]] = []

    def say(self, text: str) -> None:
        self._say(f"[{time.monotonic() - self.start:7.1f}s] {text}")

    def releases(self) -> list[Version]:
        p = self.plan
        if p.wheels is not None:
            files, where = cand.wheel_folder(p.wheels), f"--wheels {p.wheels}"
        else:
            where = cand.project_url(p.sources.index_url or DEFAULT_INDEX, p.package)
            files = cand.fetch_page(where)
        found = cand.versions(files, p.package)
        for v in (p.good, p.bad):
            cand.require(found, v, where)
        return cand.between(found, p.good, p.bad)

    def test(self, version: Version, sources: Sources) -> Outcome:
        """Install (or reuse) the venv of one candidate and run the case in it; never raises for a bad one."""
        p, t0 = self.plan, time.monotonic()
        cached = self.cache.cached(p.package, str(version)) is not None
        self.say(f"{p.package} {version}: " + ("cached venv" if cached else "installing ..."))
        entry: dict[str, Any] = {"version": str(version), "installed": False}
        try:
            venv, entry["installed"] = self.cache.get(p.package, str(version), p.recipe, sources, p.log)
        except InstallFailed as e:
            got = Outcome(SKIP, "install failed", str(e))
        else:
            t1 = time.monotonic()
            entry["install_s"] = round(t1 - t0, 1)
            self.say(f"{p.package} {version}: testing the case ...")
            got = run_case(venv / "bin" / "python", p.root, p.case_id, p.timeout_s, p.log, p.pytest_args)
            entry["test_s"] = round(time.monotonic() - t1, 1)
        entry.update(verdict=got.verdict, outcome=got.outcome, message=got.message, recorded=dict(got.recorded))
        self.tested.append(entry)
        extra = " (skipped: no verdict)" if got.verdict == SKIP else ""
        self.say(f"{p.package} {version}: {got.verdict}{extra} - {got.describe()[:300]}")
        return got

    def commits(self, found: Found[Version], old: str) -> Found[Version] | None:
        """Narrow a found release pair to the per-commit builds between them, where the index has any."""
        p = self.plan
        assert p.commit_index is not None and found.last_old is not None and found.first_new is not None
        url = cand.project_url(p.commit_index, p.package)
        builds = [v for v in cand.between(cand.versions(cand.fetch_page(url), p.package), found.last_old,
                                          found.first_new, dev=True) if v not in (found.last_old, found.first_new)]
        if not builds:
            self.say(f"--commits: {url} has no per-commit build between {found.last_old} and {found.first_new}")
            return None
        self.say(f"--commits: {len(builds)} per-commit builds between {found.last_old} and {found.first_new}")
        # the project page is a page of links: uv reads it as find-links, whatever the index's layout
        page = url + "index.html" if url.startswith("file:") and url.endswith("/") else url
        sources = dataclasses.replace(p.sources, find_links=(*p.sources.find_links, page))
        ends = [found.last_old, found.first_new]
        known = {v: found.outcomes[v] for v in ends}
        return search([ends[0], *builds, ends[1]], old, lambda v: self.test(v, sources), known)

    def run(self) -> tuple[dict[str, Any], int]:
        p = self.plan
        if p.good == p.bad:
            raise BisectError(f"--good and --bad are the same release ({p.good}): nothing to bisect")
        require_case(p.root, p.case_id)  # a malformed or unknown case fails before anything is installed
        releases = self.releases()
        old = GOOD if p.good < p.bad else BAD
        self.say(f"{len(releases)} candidate releases of {p.package}: {', '.join(map(str, releases))}")
        found = search(releases, old, lambda v: self.test(v, p.sources))
        narrowed = self.commits(found, old) if p.commit_index and found.status == "found" else None
        record = self.record(releases, old, found, narrowed)
        write_atomic(p.record, dump_json(record))
        for line in summary_lines(record):
            self._say(line)
        return record, 0 if found.status == "found" and (narrowed is None or narrowed.status == "found") else 1

    def record(self, releases: list[Version], old: str, found: Found[Version],
               narrowed: Found[Version] | None) -> dict[str, Any]:
        p = self.plan
        return {
            "case": node_id(p.case_id), "package": p.package, "good": str(p.good), "bad": str(p.bad),
            "looking_for": "first bad" if old == GOOD else "first good",
            "candidates": [str(v) for v in releases], **_found(found),
            "commits": (_found(narrowed) | {"first_commit": cand.commit_of(narrowed.first_new)
                                            if narrowed.first_new else None}) if narrowed else None,
            "tested": self.tested, "installs": sum(1 for t in self.tested if t["installed"]),
            "wall_s": round(time.monotonic() - self.start, 1), "log": str(p.log),
        }


def _found(found: Found[Version]) -> dict[str, Any]:
    def said(v: Version | None) -> dict[str, Any] | None:
        o = found.outcomes.get(v) if v is not None else None
        return {"version": str(v), "verdict": o.verdict, "outcome": o.outcome, "said": o.describe()} if o else None

    return {"status": found.status, "problem": found.problem, "last_unchanged": said(found.last_old),
            "first_changed": said(found.first_new), "untestable": [str(v) for v in found.untestable]}


def summary_lines(record: dict[str, Any]) -> list[str]:
    """The answer, as a maintainer reads it at the end of the log."""
    pkg, what = record["package"], record["looking_for"]
    if record["status"] == "endpoints":
        return [f"bisect: cannot bisect: {record['problem']}"]
    old, new = record["last_unchanged"], record["first_changed"]
    lines = [f"bisect: {what} release of {pkg}: {new['version']}" if record["status"] == "found" else
             f"bisect: {what} release of {pkg} is one of {', '.join(record['untestable'] + [new['version']])} "
             f"(those before {new['version']} gave no verdict)",
             f"  {old['version']} ({old['verdict']}) {old['said']}", f"  {new['version']} ({new['verdict']}) "
             f"{new['said']}"]
    c = record["commits"]
    if c and c["status"] != "endpoints":
        lines.append(f"bisect: {what} per-commit build: {c['first_changed']['version']}"
                     + (f" (commit {c['first_commit']})" if c["first_commit"] else "")
                     + (f", or one of the untestable {', '.join(c['untestable'])}" if c["untestable"] else "")
                     + f"; last {c['last_unchanged']['verdict']}: {c['last_unchanged']['version']}")
    lines.append(f"bisect: {record['installs']} installs, {len(record['tested'])} tested, {record['wall_s']} s; "
                 f"log {record['log']}")
    return lines
