"""This host's NVIDIA compute-sanitizer, which a mode with a `sanitizer:` knob wraps the engine child in.

The executable is the runner's, never the matrix's: the path a runner gives (--compute-sanitizer), else the one on
PATH, else where the CUDA toolkit installs it ($CUDA_HOME/bin, then /usr/local/cuda/bin: the measured H200 host had
it there and not on PATH). Looking costs no subprocess."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

EXECUTABLE = "compute-sanitizer"
TOOLKIT_DIRS = ("$CUDA_HOME/bin", "/usr/local/cuda/bin")


def find(given: Path | None = None) -> Path | None:
    """The compute-sanitizer to run, or None when this host has none."""
    if given is not None:
        return given if _runnable(given) else None
    on_path = shutil.which(EXECUTABLE)
    if on_path:
        return Path(on_path)
    for d in TOOLKIT_DIRS:
        expanded = os.path.expandvars(d)
        if "$" not in expanded and _runnable(Path(expanded) / EXECUTABLE):
            return Path(expanded) / EXECUTABLE
    return None


def missing(given: Path | None = None) -> str:
    """Why no compute-sanitizer can run here, in words a runner owner can act on."""
    if given is not None:
        return f"--compute-sanitizer {given} is not an executable file"
    return (f"no {EXECUTABLE} on PATH, in {' or '.join(TOOLKIT_DIRS)} (it ships with the CUDA toolkit; or pass "
            f"--compute-sanitizer PATH)")


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
