"""The one way quantmatrix writes a file others read: a temp file beside it, fsync, then rename. A reader (a
worker waiting on a result, tomorrow's report, a browser) sees the old file or the new one, never half."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `data` to `path` atomically, keeping the mode an existing file (or a plain open()) would have."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0o22)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)  # mkstemp makes 0600
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def dump_json(data: Any) -> str:
    """Strict JSON (no NaN or Infinity: strict parsers refuse them), sorted and indented for diffs."""
    return json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n"
