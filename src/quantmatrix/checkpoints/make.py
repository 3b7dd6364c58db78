"""Hand a matrix's synthetic checkpoint to vLLM (or anyone) as a plain directory (`quantmatrix checkpoint`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from quantmatrix.checkpoints.store import spec_of, write
from quantmatrix.errors import QuantmatrixError
from quantmatrix.schema.model import Matrix
from quantmatrix.schema.yamldoc import closest


def make(matrix: Matrix, name: str, out: Path) -> Path:
    """Write synthetic checkpoint `name` to `out` (which must not exist or be empty), via a sibling temp
    directory and one rename, so a killed run leaves no half checkpoint at `out`."""
    ck = next((c for c in matrix.checkpoints if c.id == name), None)
    if ck is None:
        ids = [c.id for c in matrix.checkpoints]
        raise QuantmatrixError(f"{matrix.path}: no checkpoint {name!r}{closest(name, ids)}; "
                               "`quantmatrix checkpoint list` names them")
    if ck.source.kind != "synthetic":
        raise QuantmatrixError(f"{ck.where}: checkpoint {name!r} is a {ck.source.kind} source, not synthetic")
    spec = spec_of(ck)
    out = out.resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise QuantmatrixError(f"{out} exists and is not an empty directory; choose a new --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tmp.chmod(0o755)
        write(spec, tmp)
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def listing(matrix: Matrix) -> list[str]:
    """One line per checkpoint: id, producer, scheme, source, label."""
    rows = []
    for c in matrix.checkpoints:
        src = c.source.kind if c.source.kind != "synthetic" else "synthetic " + ", ".join(
            f"{k}={v}" for k, v in c.source.value.items())
        rows.append(f"{c.id}\t{c.producer}\t{c.scheme.name}\t{src}\t{c.label}")
    return rows
