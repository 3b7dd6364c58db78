"""The one harness the hand-made vLLM bug tests share: patch vLLM's modules as soon as they are imported, in every
Python process that has a directory on PYTHONPATH (a child pytest, its rank processes, a real engine's workers).

`install(tmp, {vllm module: "bugs_module.function"})` writes a `sitecustomize.py` whose import hook runs the named
function on each module right after it executes, and returns the PYTHONPATH that carries it (with this tests/
directory, where the bug modules live). `checkpoint_now()` is the checkpoint vLLM is building or loading now, so a
bug can act on its own checkpoint only, and `child_pytest` runs the cpu tier's cases under it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_SITECUSTOMIZE = '''
import importlib
import importlib.abc
import sys

_PATCHES = {patches!r}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patch each module above right after it executes (the test's hand-made vLLM changes)."""

    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            owner, function = _PATCHES[name].rsplit(".", 1)
            getattr(importlib.import_module(owner), function)(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchOnImport())
'''


def install(tmp: Path, patches: dict[str, str]) -> str:
    """The PYTHONPATH under which every Python process patches each vLLM module with its function."""
    where = tmp / "sitecustomize"
    where.mkdir(exist_ok=True)
    (where / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(patches=patches), encoding="utf-8")
    path = [str(where), str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(p for p in path if p)


def checkpoint_now() -> str | None:
    """The resolved directory of the checkpoint vLLM is building or loading now (its current config's model)."""
    from vllm.config import get_current_vllm_config

    try:
        model = get_current_vllm_config().model_config
    except Exception:  # noqa: BLE001 - outside a config: nothing of ours is loading
        return None
    path = getattr(model, "model", None)
    return str(Path(path).resolve()) if path else None


def child_pytest(tmp: Path, nodes: list[str], env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """One child pytest over `nodes` (suites/...) under `env`, as a user runs it: "file.py::test[case]" ->
    (passed / failed / error, the failure's message)."""
    from junitparser import Error, Failure, JUnitXml

    junit = tmp / "junit.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", *nodes, "-p", "no:cacheprovider", "-p", "no:randomly",
                           "-n", "0", "-q", f"--junitxml={junit}", "-o", "junit_family=xunit1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert junit.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    out = {}
    for case in (c for suite in JUnitXml.fromfile(str(junit)) for c in suite):
        bad = [r for r in case.result if isinstance(r, (Failure, Error))]
        outcome = "passed" if not bad else "failed" if isinstance(bad[0], Failure) else "error"
        out[f"{case.classname.rsplit('.', 1)[-1]}.py::{case.name}"] = (
            outcome, (bad[0].message or "").removeprefix("Failed: ") if bad else "")
    assert len(out) == len(nodes), done.stdout[-3000:]
    return out
