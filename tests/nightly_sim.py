"""The nightly as a repository runs it, for the scripted multi-night simulations (tests/test_nightly_simulation.py):
each arch job through the real plugin's JUnit (one pytest run per arch runner, `--arch X -m X` over one small
two-arch matrix, as nightly-arch.yml runs it) and the real `quantmatrix report` (with the previous night's
summary.json, as nightly-report.yml runs it). The engine is tests/standin_vllm.py's stand-in (vLLM's CPU engine
costs ~25 s a start here; one arch job ~2-3 s); what breaks or diverges is the arch's `fake_kernel`, the wheel
the stand-in package installed `broken`.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import pytest
from standin_vllm import TESTS, install, two_arch_matrix

from quantmatrix.cli import main

SRC = Path(__file__).resolve().parent.parent / "src"
TODAY = datetime.date.today()

MATRIX = two_arch_matrix("tiny-a", "tiny-b")


class Nightly:
    """The runners and the report workflow of one repository, night after night."""

    def __init__(self, pytester: pytest.Pytester, tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.pytester, self.tmp, self.capsys = pytester, tmp, capsys
        self.sites = {False: install(tmp / "site-ok"), True: install(tmp / "site-broken", broken=True)}
        self.previous: Path | None = None
        self.runs: dict[tuple[Any, ...], Path] = {}

    def runner(self, arch: str, kernel: str = "reference", *args: str, extra: str = "", broken: bool = False) -> Path:
        """One arch job's JUnit file: the real plugin over the matrix (plus `extra` YAML), reused when a later
        night runs the very same job."""
        key = (arch, kernel, args, extra, broken)
        if key not in self.runs:
            os.environ["PYTHONPATH"] = os.pathsep.join([str(self.sites[broken]), str(SRC)])
            os.environ["RUNNER_NAME"] = f"{arch}-1"
            self.pytester.makefile(".yaml", m=MATRIX.replace("KERNEL", kernel) + extra)
            junit = self.pytester.path / f"run{len(self.runs)}-{arch}.xml"
            result = self.pytester.runpytest_subprocess("--matrix", "m.yaml", "--arch", arch, "-m", arch, *args,
                                                       "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                                                       f"--junitxml={junit}")
            assert junit.is_file(), result.stdout.str()
            self.runs[key] = junit
        return self.runs[key]

    def report(self, night: int, *files: Path, conclusion: str = "") -> tuple[int, str, dict[str, Any]]:
        """`quantmatrix report` as the report workflow runs it: (exit code, headline, summary.json)."""
        out = self.tmp / f"report-n{night}"
        date = TODAY + datetime.timedelta(days=night)
        argv = ["report", *map(str, files), "--out", str(out), "--night", f"n{night}", "--date", str(date),
                "--history", "2"]
        argv += ["--previous", str(self.previous)] if self.previous else []
        argv += ["--conclusion", conclusion] if conclusion else []
        self.capsys.readouterr()
        code = main(argv)
        said = self.capsys.readouterr().out
        if (out / "summary.json").is_file():
            self.previous = out / "summary.json"
        headline = next((ln.split(": ", 2)[2] for ln in said.splitlines()
                         if ln.startswith(f"quantmatrix report: night n{night}: ")), "")
        return code, headline, json.loads((out / "summary.json").read_text()) if out.exists() else {}


@pytest.fixture
def nightly(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
            capsys: pytest.CaptureFixture[str]) -> Nightly:
    monkeypatch.setenv("PYTHONPATH", str(SRC))  # Nightly.runner sets these two per run; monkeypatch restores them
    monkeypatch.setenv("RUNNER_NAME", "")
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("QUANTMATRIX_ARCH", raising=False)
    pytester.makefile(".txt", prompts="first prompt\nsecond prompt\n")
    (pytester.path / "ck").mkdir()
    (pytester.path / "ck" / "config.json").write_text("{}")
    pytester.makepyfile(test_e2e=TESTS)
    return Nightly(pytester, tmp_path, capsys)


GREEN = "✅ nothing is failing and nothing stopped being tested"
A, B = "test_e2e::test_degeneration[tiny-a@sm121-default]", "test_e2e::test_degeneration[tiny-b@sm121-default]"


def counts(new: int = 0, still: int = 0, newly_untested: int = 0, still_untested: int = 0) -> str:
    return (f"{new} new failures, {still} still failing, {newly_untested} newly untested, {still_untested} still "
            "untested")
