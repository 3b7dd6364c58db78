"""One throwaway venv per (package, version), made with uv and kept under the quantmatrix cache with a size cap.

A venv is built in a temporary directory beside the cache entry and renamed into place only once every install
step succeeded, so an interrupted or failed install (Ctrl-C, a resolver error, a full disk) never counts as
cached, and whatever it left is removed on the way out or by the next run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from quantmatrix.atomic import dump_json, write_atomic
from quantmatrix.checkpoints.store import cache_root
from quantmatrix.errors import BisectError

CAP_ENV = "QUANTMATRIX_BISECT_CACHE_GB"
DEFAULT_CAP_GB = 40.0
_MARK = ".quantmatrix-venv.json"
_TMP = ".partial-"


def find_uv() -> str:
    """uv from the `uv` package installed beside quantmatrix, else from PATH."""
    try:
        from uv import find_uv_bin  # the PyPI package ships the binary and this finder

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        exe = shutil.which("uv")
        if exe is None:
            raise BisectError("bisect needs uv: `pip install uv` (it is in quantmatrix's dev extra)") from None
        return exe


@dataclasses.dataclass(frozen=True)
class Sources:
    """Where uv may take distributions from: an index, extra indexes, find-links folders; offline or not."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    offline: bool = False

    def uv_args(self) -> list[str]:
        args: list[str] = ["--no-index"] if self.no_index else []
        if self.index_url and not self.no_index:
            args += ["--index-url", self.index_url]
        for url in () if self.no_index else self.extra_index_urls:
            args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        if self.extra_index_urls and not self.no_index:
            args += ["--index-strategy", "unsafe-best-match"]  # e.g. torch's +cpu builds on a second index
        return args + (["--offline"] if self.offline else [])


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What goes into each venv besides the release under test: requirements resolved together with it, packages
    the resolver must leave out, and wheels installed afterwards without dependencies (quantmatrix itself)."""

    requirements: tuple[str, ...]
    excludes: tuple[str, ...] = ()
    no_deps_wheels: tuple[Path, ...] = ()


class InstallFailed(Exception):
    """uv could not make the venv; the message is the tail of what it said."""


class VenvCache:
    """`<cache>/bisect/venvs/<package>-<version>-py<XY>/`, each with a marker naming what it holds."""

    def __init__(self, root: Path | None = None, cap_gb: float | None = None, uv: str | None = None,
                 python: str = sys.executable) -> None:
        self.root = root or cache_root() / "bisect" / "venvs"
        env_cap = os.environ.get(CAP_ENV)
        self.cap = int((cap_gb if cap_gb is not None else float(env_cap) if env_cap else DEFAULT_CAP_GB) * 2**30)
        self.uv, self.python = uv or find_uv(), python
        self.tag = f"py{sys.version_info.major}{sys.version_info.minor}"
        self.in_use: set[Path] = set()

    def path(self, package: str, version: str) -> Path:
        return self.root / f"{package}-{version}-{self.tag}".replace("/", "_")

    def cached(self, package: str, version: str) -> Path | None:
        path = self.path(package, version)
        return path if (path / _MARK).is_file() else None

    def get(self, package: str, version: str, recipe: Recipe, sources: Sources, log: Path) -> tuple[Path, bool]:
        """The venv for `package==version` and whether it was built now; quantmatrix is reinstalled into a cached
        one (no deps, a second), so a cached venv always tests this checkout."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.cached(package, version)
        built = path is None
        if path is None:
            path = self._build(package, version, recipe, sources, log)
        elif recipe.no_deps_wheels:
            self._uv(["pip", "install", "--python", str(path / "bin" / "python"), "--no-deps", "--reinstall",
                      *sources.uv_args(), *map(str, recipe.no_deps_wheels)], log)
        os.utime(path / _MARK)  # least recently used goes first
        self.in_use.add(path)
        if built:
            self.trim()
        return path, built

    def _build(self, package: str, version: str, recipe: Recipe, sources: Sources, log: Path) -> Path:
        final = self.path(package, version)
        tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP}{os.getpid()}-{final.name}-", dir=self.root))
        try:
            venv = tmp / "venv"
            self._uv(["venv", "--relocatable", "--python", self.python, str(venv)], log)
            py = ["--python", str(venv / "bin" / "python")]
            excludes: list[str] = []
            if recipe.excludes:
                (tmp / "excludes.txt").write_text("\n".join(recipe.excludes) + "\n", encoding="utf-8")
                excludes = ["--excludes", str(tmp / "excludes.txt")]
            self._uv(["pip", "install", *py, *sources.uv_args(), *excludes, f"{package}=={version}",
                      *recipe.requirements], log)
            if recipe.no_deps_wheels:
                self._uv(["pip", "install", *py, "--no-deps", *sources.uv_args(),
                          *map(str, recipe.no_deps_wheels)], log)
            mark = {"package": package, "version": version, "python": self.tag, "built": time.time(),
                    "bytes": _size(venv)}
            write_atomic(venv / _MARK, dump_json(mark))
            if final.exists() and not (final / _MARK).is_file():  # an unmarked leftover: never a cached venv
                shutil.rmtree(final)
            try:
                os.rename(venv, final)  # the one step that makes it count as cached
            except OSError:
                if self.cached(package, version) is None:
                    raise
                # another bisect finished the same venv first: use its, drop this one with the temp dir
            return final
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _uv(self, args: Sequence[str], log: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "CONDA_PREFIX")}
        with log.open("a", encoding="utf-8") as out:
            out.write(f"$ uv {' '.join(args)}\n")
            out.flush()
            r = subprocess.run([self.uv, *args], stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
        if r.returncode != 0:
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-6:]
            raise InstallFailed(f"uv {args[0]} {args[1] if len(args) > 1 else ''} exited {r.returncode}: "
                                + " | ".join(line.strip() for line in tail))

    def entries(self) -> list[tuple[Path, dict]]:
        out = []
        for p in self.root.iterdir() if self.root.is_dir() else ():
            try:
                out.append((p, json.loads((p / _MARK).read_text(encoding="utf-8"))))
            except (OSError, ValueError):
                if p.name.startswith(_TMP) and _orphaned(p):
                    shutil.rmtree(p, ignore_errors=True)  # a build whose process was killed outright
        return out

    def trim(self) -> list[Path]:
        """Remove least recently used venvs (never one this run uses) until the cache fits its cap."""
        entries = sorted(self.entries(), key=lambda e: (e[0] / _MARK).stat().st_mtime)
        total = sum(int(m.get("bytes", 0)) for _, m in entries)
        removed = []
        for path, mark in entries:
            if total <= self.cap:
                break
            if path in self.in_use:
                continue
            shutil.rmtree(path, ignore_errors=True)
            total -= int(mark.get("bytes", 0))
            removed.append(path)
        return removed


def _size(root: Path) -> int:
    """Bytes on disk, each inode once (uv hard-links files from its own cache)."""
    seen, total = set(), 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def _orphaned(path: Path) -> bool:
    """A partial build whose process (named in its directory) is gone: SIGKILL skips the cleanup."""
    try:
        os.kill(int(path.name[len(_TMP):].split("-", 1)[0]), 0)
    except ProcessLookupError:
        return True
    except (ValueError, PermissionError):
        return False
    return False
