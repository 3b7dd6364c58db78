"""`quantmatrix fetch`: download a matrix's hub checkpoints into the local Hugging Face cache on a runner that has
hub access, so that test runs (HF_HUB_OFFLINE=1, the cache only) find them. The tests themselves never download.

Exit status: 0 every selected checkpoint is in the cache; 1 a download failed (the others were still tried);
2 the command was wrong or cannot start (unknown id, offline mode, too little disk).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from quantmatrix.checkpoints import store
from quantmatrix.errors import CheckpointUnavailable, QuantmatrixError
from quantmatrix.schema.model import Checkpoint, Matrix
from quantmatrix.schema.yamldoc import closest

_OFF = ("1", "true", "yes", "on")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One hub checkpoint of the matrix, and where the local cache holds it (None: not there)."""

    checkpoint: Checkpoint
    cached: Path | None
    configs_only: str | None = None  # why only the config files are fetched (this host cannot serve it)

    @property
    def repo(self) -> str:
        return self.checkpoint.source.value[0]

    @property
    def revision(self) -> str:
        return self.checkpoint.source.value[1]

    @property
    def command(self) -> str:
        return store.download_command(self.repo, self.revision)


def plan(matrix: Matrix, only: Sequence[str] = (), gpus: int | None = None) -> list[Entry]:
    """The matrix's hub checkpoints (or the `only` ones), each looked up in the local cache. On a runner with
    `gpus` GPUs, a checkpoint that needs more gets its config files only: its config checks run here, its
    weights would only fill the disk."""
    by_id = {c.id: c for c in matrix.checkpoints}
    for ck_id in only:
        if ck_id not in by_id:
            raise QuantmatrixError(f"--only {ck_id}: {matrix.path} has no checkpoint {ck_id!r}"
                                   f"{closest(ck_id, by_id)}")
        if by_id[ck_id].source.kind != "hub":
            raise QuantmatrixError(f"--only {ck_id}: a {by_id[ck_id].source.kind} checkpoint "
                                   f"({by_id[ck_id].where}); only hub checkpoints are fetched")
    chosen = [by_id[i] for i in dict.fromkeys(only)] if only else \
        [c for c in matrix.checkpoints if c.source.kind == "hub"]
    if not chosen:
        raise QuantmatrixError(f"{matrix.path} has no hub checkpoints: nothing to fetch")
    out = []
    for c in chosen:
        why = f"needs {c.gpus} GPUs, this runner has {gpus}" if gpus is not None and c.gpus > gpus else None
        out.append(Entry(c, _cached(c, why is not None), why))
    return out


def _cached(checkpoint: Checkpoint, configs_only: bool = False) -> Path | None:
    try:
        return store.resolve_hub(*checkpoint.source.value, configs_only=configs_only)
    except CheckpointUnavailable:
        return None


def _size(checkpoint: Checkpoint) -> str:
    return f"{checkpoint.size_gb:g} GB" if checkpoint.size_gb is not None else "size unknown"


def _free_bytes(path: Path) -> int:
    """Free space where `path` will be created (its nearest existing ancestor)."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    return shutil.disk_usage(existing).free


def fetch(entries: list[Entry], dry_run: bool) -> int:
    cache = store.hub_cache()
    for e in entries:
        where = f"cached at {e.cached}" if e.cached else "not cached"
        what = f"config files only ({e.configs_only})" if e.configs_only else _size(e.checkpoint)
        print(f"{e.checkpoint.id}: {e.repo}@{e.revision}, {what}, {where}")
    missing = [e for e in entries if e.cached is None]
    need = sum(e.checkpoint.size_gb or 0 for e in missing if not e.configs_only)
    unknown = sum(1 for e in missing if e.checkpoint.size_gb is None and not e.configs_only)
    print(f"{len(missing)} of {len(entries)} not in {cache}: about {need:g} GB to download"
          + (f", plus {unknown} of unknown size" if unknown else ""))
    if dry_run:
        for e in missing:
            print(e.command + (" " + " ".join(f"--include {shlex.quote(p)}" for p in store.CONFIG_PATTERNS)
                               if e.configs_only else ""))
        return 0
    if not missing:
        return 0
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _OFF:
        raise QuantmatrixError("HF_HUB_OFFLINE is set, so huggingface_hub will not download: unset it for this "
                               "command (test runs keep it set)")
    free = _free_bytes(cache)
    if need * 1e9 > free:
        raise QuantmatrixError(f"the checkpoints to download need about {need:g} GB but {cache} has "
                               f"{free / 1e9:.0f} GB free: make room, move the cache (HF_HUB_CACHE) or pick some "
                               "with --only")
    try:
        import huggingface_hub
    except ImportError as e:
        raise QuantmatrixError(f"fetch needs huggingface_hub ({e}): pip install huggingface_hub") from None
    failed = 0
    for e in missing:
        print(f"fetching {e.checkpoint.id}: {e.command}", flush=True)
        try:
            only = {"allow_patterns": list(store.CONFIG_PATTERNS)} if e.configs_only else {}
            huggingface_hub.snapshot_download(repo_id=e.repo, revision=e.revision, cache_dir=str(cache), **only)
            path = store.resolve_hub(e.repo, e.revision, configs_only=e.configs_only is not None)
        except CheckpointUnavailable as err:
            failed += 1
            print(f"quantmatrix fetch: {e.checkpoint.id}: downloaded, but not where the tests look: {err}",
                  file=sys.stderr)
        except Exception as err:  # network, auth, missing revision: report it and go on with the others
            failed += 1
            print(f"quantmatrix fetch: {e.checkpoint.id}: {type(err).__name__}: {err}", file=sys.stderr)
        else:
            print(f"  -> {path}")
    print(f"{len(missing) - failed} of {len(missing)} downloaded" + (f", {failed} failed" if failed else ""))
    return 1 if failed else 0
