"""The project's rule for a test file that needs vLLM (or a part of it): under CI (.ci/run sets CI=1) the file
errors at collection, elsewhere it skips with the reason. `run_copy` runs a copy of such a file with the part
blocked, so each file can prove it follows the rule."""

from __future__ import annotations

import pytest


def run_copy(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, source: str, ci: str,
             deselect: str, error: str, skip: str) -> None:
    """Run `source` (with the tests matching `deselect` left out) under CI=`ci`: errored with `error`, or skipped
    saying `skip`."""
    monkeypatch.setenv("CI", ci)
    pytester.makepyfile(test_copy=source)
    result = pytester.runpytest("test_copy.py", "-p", "no:quantmatrix", "-p", "no:quantmatrix_e2e", "-rs",
                                "-k", f"not {deselect}")
    if ci:
        assert result.ret == pytest.ExitCode.INTERRUPTED
        result.stdout.fnmatch_lines([f"*ImportError: {error}*"])
    else:
        result.assert_outcomes(skipped=1)
        result.stdout.fnmatch_lines([f"*{skip}*"])
