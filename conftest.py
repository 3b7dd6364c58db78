"""Thin on purpose: the quantmatrix plugin (a pytest11 entry point) does the work, so `pytest -m sm120` behaves
the same from any checkout. Run output and benchmarks are never collected."""

from __future__ import annotations

import pytest

collect_ignore = ["reports", "bench"]

_PLUGINS = ("quantmatrix", "quantmatrix_e2e")


def pytest_configure(config: pytest.Config) -> None:
    """An environment whose quantmatrix metadata lacks the entry points (installed before they existed, or not
    installed at all) would run suites/ without the plugin: refuse, rather than half-load it from here."""
    pm = config.pluginmanager
    missing = [n for n in _PLUGINS if not pm.has_plugin(n) and not pm.is_blocked(n)]
    if missing:
        raise pytest.UsageError(f"the pytest plugin(s) {', '.join(missing)} of quantmatrix are not installed in "
                                "this environment (an install older than its entry points, or none): run "
                                "`pip install -e .` in this checkout")
