"""Which releases lie between two versions: read from a package index's simple API (PEP 691 JSON, else PEP 503
HTML, over http(s) or file://) or from a local folder of wheels (an air-gapped runner).

Only files this interpreter could install count (wheel tags, yanked files left out), so a release that exists
only for another platform is never a candidate that then "fails to install".
"""

from __future__ import annotations

import dataclasses
import html.parser
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from quantmatrix.errors import BisectError

_JSON = "application/vnd.pypi.simple.v1+json"
_ACCEPT = f"{_JSON}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
_COMMIT = re.compile(r"(?:^|[.+])g?([0-9a-f]{7,40})$")


@dataclasses.dataclass(frozen=True)
class IndexFile:
    """One distribution file a project page lists."""

    filename: str
    yanked: bool = False


class _Links(html.parser.HTMLParser):
    """PEP 503: every <a> is a file; its text is the filename, data-yanked marks a yanked one."""

    def __init__(self) -> None:
        super().__init__()
        self.files: list[IndexFile] = []
        self._open: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._open = dict(attrs)

    def handle_endtag(self, tag: str) -> None:
        self._open = None if tag == "a" else self._open

    def handle_data(self, data: str) -> None:
        if self._open is not None and data.strip():
            href = self._open.get("href") or ""
            name = urllib.parse.unquote(href.split("#")[0].rsplit("/", 1)[-1]) or data.strip()
            self.files.append(IndexFile(name, "data-yanked" in self._open))
            self._open = None


def project_url(index: str, package: str) -> str:
    """The project page: `{package}` in a template is replaced, else PEP 503's `<index>/<name>/`."""
    name = canonicalize_name(package)
    if "{package}" in index:
        return index.replace("{package}", name)
    return index.rstrip("/") + f"/{name}/"


def fetch_page(url: str, timeout: float = 60.0) -> list[IndexFile]:
    """The files a project page lists; a file:// directory is read through its index.html."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        path = Path(urllib.request.url2pathname(parsed.path))
        target = path / "index.html" if path.is_dir() else path
        try:
            return _parse(target.read_bytes(), "text/html")
        except OSError as e:
            raise BisectError(f"{url}: cannot read the index page: {e.strerror or e}") from None
    if parsed.scheme not in ("http", "https"):
        raise BisectError(f"{url}: an index must be http(s):// or file://")
    request = urllib.request.Request(url, headers={"Accept": _ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:  # noqa: S310 - scheme checked above
            return _parse(r.read(), r.headers.get("Content-Type", "text/html"))
    except urllib.error.HTTPError as e:
        raise BisectError(f"{url}: the index answered HTTP {e.code} (is the package name right?)") from None
    except (urllib.error.URLError, TimeoutError) as e:
        raise BisectError(f"{url}: cannot reach the index: {getattr(e, 'reason', e)}") from None


def _parse(body: bytes, content_type: str) -> list[IndexFile]:
    if content_type.split(";")[0].strip() == _JSON:
        try:
            data = json.loads(body)
            return [IndexFile(f["filename"], bool(f.get("yanked"))) for f in data["files"]]
        except (ValueError, KeyError, TypeError) as e:
            raise BisectError(f"the index's JSON page is malformed: {e}") from None
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    return parser.files


def wheel_folder(folder: Path) -> list[IndexFile]:
    """The wheels (and sdists) in a local folder, as an index page would list them."""
    if not folder.is_dir():
        raise BisectError(f"--wheels {folder}: not a directory")
    return [IndexFile(p.name) for p in sorted(folder.iterdir()) if p.is_file()]


def versions(files: Iterable[IndexFile], package: str) -> list[Version]:
    """The versions of `package` with a file this interpreter can install (a compatible wheel or an sdist)."""
    name, tags = canonicalize_name(package), set(sys_tags())
    found: set[Version] = set()
    for f in files:
        if f.yanked:
            continue
        try:
            if f.filename.endswith(".whl"):
                dist, version, _, wheel_tags = parse_wheel_filename(f.filename)
                if not tags & wheel_tags:
                    continue
            else:
                dist, version = parse_sdist_filename(f.filename)
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue
        if dist == name:
            found.add(version)
    return sorted(found)


def between(available: Iterable[Version], a: Version, b: Version, *, dev: bool = False) -> list[Version]:
    """The releases from min(a, b) to max(a, b), both ends included, ascending. Pre-releases and dev builds count
    only when asked (`dev`: a commit range) or when an end is one."""
    lo, hi = min(a, b), max(a, b)
    want_pre = dev or lo.is_prerelease or hi.is_prerelease
    return [v for v in sorted(set(available)) if lo <= v <= hi and (want_pre or not v.is_prerelease)]


def require(found: list[Version], wanted: Version, where: str) -> None:
    """An end of the range the index does not hold is a usage error naming the closest versions it does hold."""
    if wanted not in found:
        at = sum(1 for v in found if v < wanted)
        near = ", ".join(map(str, found[max(0, at - 2):at + 2])) or "none"
        raise BisectError(f"{where} has no installable {wanted} ({len(found)} versions there; near it: {near})")


def commit_of(version: Version) -> str | None:
    """The commit a per-commit build names in its local version (`0.29.0.dev45+g1a2b3c4`), if it names one."""
    m = _COMMIT.search(version.local or "")
    return m.group(1) if m else None
