"""The entry points pyproject.toml declares name modules that exist, and an install whose metadata predates a
move of those modules fails loudly at pytest start-up instead of running the suites half-loaded."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
DECLARED = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]


def test_every_declared_entry_point_loads():
    """pytest11 modules import and define hooks; the vLLM general plugin and the script are callables."""
    for name, value in DECLARED["pytest11"].items():
        module = importlib.import_module(value)
        assert any(n.startswith("pytest_") for n in vars(module)), f"{name} = {value} defines no pytest hook"
    for value in DECLARED["vllm.general_plugins"].values():
        module, _, attr = value.partition(":")
        assert callable(getattr(importlib.import_module(module), attr))


def test_an_install_older_than_the_layout_fails_loudly(tmp_path):
    """Metadata written before the restructure (entry points quantmatrix.plugin, quantmatrix.e2e_plugin) makes
    pytest stop at start-up naming the missing module: never a session without the plugin."""
    dist = tmp_path / "quantmatrix-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: quantmatrix\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nquantmatrix = quantmatrix.plugin\n"
                                           "quantmatrix_e2e = quantmatrix.e2e_plugin\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "suites"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "No module named 'quantmatrix.plugin'" in proc.stdout + proc.stderr
