"""The one harness the hand-made vLLM bug tests share: patch vLLM's modules as soon as they are imported, in every
Python process that has a directory on PYTHONPATH (a child pytest, its rank processes, a real engine's workers).

`install(tmp, {vllm module: "bugs_module.function"})` writes a `sitecustomize.py` whose import hook runs the named
function on each module right after it executes, and returns the PYTHONPATH that carries it (with this tests/
directory, where the bug modules live). `checkpoint_now()` is the checkpoint vLLM is building or loading now, so a
bug can act on its own checkpoint only.
"""

from __future__ import annotations

import os
from pathlib import Path

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
