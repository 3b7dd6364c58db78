"""Hand a matrix's synthetic checkpoint to vLLM (or anyone) as a plain directory (`quantmatrix checkpoint`), and
the bytes of every one it can build (tests/factory_digests.json holds them)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from quantmatrix.checkpoints.store import spec_of, write
from quantmatrix.errors import QuantmatrixError
from quantmatrix.schema.model import Matrix
from quantmatrix.schema.synthetic import SyntheticSpec
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


_TWIN_SIZES = ("cpu_tiny", "gpu_tiny")  # the sizes an engine runs a synthetic checkpoint at (schema.e2e platforms)


def every_build(matrix: Matrix) -> dict[str, SyntheticSpec]:
    """`<id>@<size>` -> spec of every synthetic checkpoint of the matrix at its own size and at each size an
    engine runs a twin at (cpu_tiny, gpu_tiny)."""
    return {f"{c.id}@{size}": dataclasses.replace(spec_of(c), size=size) for c in matrix.checkpoints
            if c.source.kind == "synthetic" for size in dict.fromkeys((*_TWIN_SIZES, spec_of(c).size))}


def file_digests(spec: SyntheticSpec) -> dict[str, str]:
    """sha256 of every file the factory writes for `spec`, by path inside the checkpoint: built fresh in a temporary
    directory, never read from the cache."""
    with tempfile.TemporaryDirectory(prefix="quantmatrix-digest-") as tmp:
        write(spec, Path(tmp))
        return {p.relative_to(tmp).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(Path(tmp).rglob("*")) if p.is_file()}


# The packages whose output the factory's bytes depend on (random weights, the tokenizer, the reference run, the
# safetensors layout, compressed-tensors' own configs).
BYTES_DEPEND_ON = ("torch", "transformers", "tokenizers", "safetensors", "compressed-tensors")


def environment() -> dict[str, str]:
    """The installed versions of BYTES_DEPEND_ON: recorded with the digests, named when they differ."""
    return {name: importlib.metadata.version(name) for name in BYTES_DEPEND_ON}


def drift(recorded: Mapping[str, Mapping[str, str]], built: Mapping[str, Mapping[str, str]]) -> list[str]:
    """One line per checkpoint whose files differ from the recorded ones (or that only one side has)."""
    out = []
    for label in sorted(set(recorded) | set(built)):
        want, got = recorded.get(label), built.get(label)
        if want is None or got is None:
            out.append(f"{label}: {'not recorded' if want is None else 'recorded, but no matrix builds it'}")
        elif want != got:
            files = sorted(f for f in set(want) | set(got) if want.get(f) != got.get(f))
            out.append(f"{label}: {', '.join(files)} differ")
    return out
