"""A wheel of a distribution as it is installed here, so a throwaway venv gets exactly this quantmatrix (an
editable install stays editable: its .pth and entry points travel) without a build backend or a network."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import sys
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name

from quantmatrix.errors import BisectError


def _tag(dist: importlib.metadata.Distribution) -> str:
    """The wheel tag it was installed from (WHEEL's first Tag line); a pure wheel when none is recorded."""
    wheel = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    return tags[0] if tags else "py3-none-any"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def repack(name: str, out_dir: Path) -> Path:
    """Write `<name>-<version>-<tag>.whl` into `out_dir` from the installed files (scripts outside site-packages
    and bytecode are left out: the installer remakes them) and return its path."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise BisectError(f"{name} is not installed in {sys.prefix}") from None
    stem = f"{canonicalize_name(dist.metadata['Name']).replace('-', '_')}-{dist.version}"
    info = f"{stem}.dist-info"
    base = Path(str(dist.locate_file("")))
    records: list[str] = []
    path = out_dir / f"{stem}-{_tag(dist)}.whl"
    tmp = path.with_suffix(".partial")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for f in dist.files or ():
            rel = f.as_posix()
            if rel.startswith("..") or "__pycache__" in f.parts or rel.endswith((".pyc", "/RECORD", "/INSTALLER",
                                                                                  "/REQUESTED", "/direct_url.json")):
                continue
            arc = f"{info}/{f.name}" if f.parts[0].endswith(".dist-info") else rel
            data = (base / f).read_bytes()
            z.writestr(arc, data)
            records.append(_record_line(arc, data))
        records.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    tmp.replace(path)
    return path
