"""Checkpoint directories for matrix cells: synthetic ones assembled, labelled and built into a content-addressed
cache (the only place a checkpoint is put together: family, scheme, producer, faults), local paths, and hub ids
resolved from the local Hugging Face cache only (this suite never downloads at test time)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantmatrix import bounded
from quantmatrix.checkpoints.configs import plain_files
from quantmatrix.errors import CheckpointUnavailable, MatrixError
from quantmatrix.schema.factory import UNQUANTIZED
from quantmatrix.schema.model import Checkpoint
from quantmatrix.schema.synthetic import SyntheticSpec
from quantmatrix.schema.vocab import bad_hub_repo, bad_hub_revision

if TYPE_CHECKING:
    import torch

# Bumped whenever the factory (any scheme or producer module included) writes different bytes for the same spec:
# the cache key. tests/factory_digests.json holds the bytes of every matrix checkpoint at this version.
FACTORY_VERSION = 2
_COMPLETE = ".quantmatrix-complete"
DEQUANTIZED = "dequantized"


def cache_root() -> Path:
    """QUANTMATRIX_CACHE, else ~/.cache/quantmatrix: one place a runner can wipe or keep between nights."""
    env = os.environ.get("QUANTMATRIX_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "quantmatrix"


def digest(spec: SyntheticSpec) -> str:
    """The cache key of a spec: its fields and the factory version that writes its bytes."""
    blob = json.dumps({"spec": dataclasses.asdict(spec), "factory": FACTORY_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def spec_of(checkpoint: Checkpoint) -> SyntheticSpec:
    """The factory spec of a synthetic checkpoint (the matrix has already rejected impossible ones): its producer,
    the factory scheme its matrix scheme names, its `synthetic:` flags."""
    assert checkpoint.scheme.factory is not None, "the loader refuses a synthetic checkpoint of a scheme without one"
    return SyntheticSpec(producer=checkpoint.producer, scheme=checkpoint.scheme.factory, **checkpoint.source.value)


def base_spec(spec: SyntheticSpec) -> SyntheticSpec:
    """The bf16 family member a quantized spec was made from (same model, size and seed)."""
    producer, scheme = UNQUANTIZED
    return SyntheticSpec(producer=producer, scheme=scheme, model=spec.model, size=spec.size, seed=spec.seed)


def materialize(checkpoint: Checkpoint) -> Path:
    """The checkpoint's directory, building a synthetic one if the cache does not hold it complete."""
    kind = checkpoint.source.kind
    if kind == "path":
        path = Path(checkpoint.source.value)
        if not (path / "config.json").is_file():
            raise CheckpointUnavailable(f"{checkpoint.source.where}: {path} has no config.json")
        return path
    if kind == "hub":
        repo, revision = checkpoint.source.value
        return resolve_hub(repo, revision)
    spec = spec_of(checkpoint)
    try:
        return materialize_spec(spec, checkpoint.id)
    except MatrixError as e:
        raise MatrixError(f"{checkpoint.source.where}: checkpoint {checkpoint.id!r}: {e}") from None


def base_of(checkpoint: Checkpoint) -> Path:
    """The bf16 family member a synthetic checkpoint was made from, from the cache (`base-<model>-<size>-seed<n>`)."""
    spec = base_spec(spec_of(checkpoint))
    return materialize_spec(spec, f"base-{spec.model}-{spec.size}-seed{spec.seed}")


def twin(checkpoint: Checkpoint, size: str) -> Path | None:
    """The synthetic checkpoint built at another size (`<id>-<size>`, e.g. the engine's GPU-sized twin), or None
    where the checkpoint itself serves: not synthetic, or already that size."""
    if checkpoint.source.kind != "synthetic":
        return None
    spec = spec_of(checkpoint)
    return None if spec.size == size else materialize_spec(dataclasses.replace(spec, size=size),
                                                           f"{checkpoint.id}-{size}")


def materialize_spec(spec: SyntheticSpec, label: str) -> Path:
    """The cache entry of one spec (`label-<digest>`), built unless already complete: a hash check only."""
    key = digest(spec)
    final = cache_root() / "checkpoints" / f"{label}-{key[:16]}"
    if not _complete(final, key):
        build(spec, final, key)
    return final


def _complete(path: Path, key: str) -> bool:
    marker = path / _COMPLETE
    return marker.is_file() and marker.read_text() == key


def build(spec: SyntheticSpec, final: Path, key: str) -> None:
    """Write into a private temp dir, then rename: a killed run never leaves a directory a later run trusts."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would survive the rename
    try:
        write(spec, tmp)
        (tmp / _COMPLETE).write_text(key)
        if final.exists() and not _complete(final, key):  # a stale or half-written leftover
            shutil.rmtree(final)
        try:
            os.rename(tmp, final)
        except OSError:
            if not _complete(final, key):  # not merely another worker finishing first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class Contents:
    """Everything the factory writes for a spec, in memory: `write` puts exactly this on disk."""

    json_files: dict[str, Any]  # config.json, generation_config.json, a producer's own config, the reference
    tensors: dict[str, torch.Tensor]  # model.safetensors, faults applied
    tokenizer: dict[str, str]
    dequantized: Contents | None = None  # dequantized/: the bf16 model the clean tensors encode


def contents(spec: SyntheticSpec) -> Contents:
    """The checkpoint of a spec: the family's bf16 model, encoded by the spec's scheme as its producer writes it,
    the spec's faults planted, the producer's config files. A quantized one also gets dequantized/ (the bf16 model
    its clean tensors encode, the e2e tier's reference); an unquantized one is its own reference and carries
    transformers' greedy continuation of the shipped prompts (base.REFERENCE_FILE)."""
    from quantmatrix.checkpoints import base, faults, producers, schemes  # torch, transformers: only when building

    family = base.base(spec.model, spec.size, spec.seed)
    producer = producers.producer(spec.producer)
    with base.one_thread():
        encoded = schemes.scheme(spec).encode(spec, family, producer)
    tensors = dict(sorted(faults.apply(spec, encoded.tensors).items()))
    files = producer.config_files(spec, plain_files(spec.model, spec.size))
    if encoded.dequantized is None:
        return Contents({**files, base.REFERENCE_FILE: family.reference}, tensors, family.tokenizer)
    clean = Contents(plain_files(spec.model, spec.size), encoded.dequantized, family.tokenizer)
    return Contents(files, tensors, family.tokenizer, clean)


def write(spec: SyntheticSpec, out: Path) -> None:
    """Write the whole checkpoint of a spec into `out` (which must exist)."""
    _write(contents(spec), out)


def _write(c: Contents, out: Path) -> None:
    from quantmatrix.checkpoints.base import write_hf

    write_hf(out, c.json_files, c.tensors, c.tokenizer)
    if c.dequantized is not None:
        (out / DEQUANTIZED).mkdir()
        _write(c.dequantized, out / DEQUANTIZED)


def hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(home) / "hub"


def download_command(repo: str, revision: str) -> str:
    """The line that puts repo@revision into the cache resolve_hub reads (`hf` is huggingface_hub's CLI since
    0.34; 1.0 removed `huggingface-cli`)."""
    return shlex.join(["hf", "download", repo, "--revision", revision])


def missing_shards(snap: Path) -> list[str]:
    """The weight files a snapshot's index names that are not there (all of them, when it has neither an index
    nor a single *.safetensors file): a snapshot counts as cached only when it is complete."""
    index = snap / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(bounded.read_bytes(index, "index"))["weight_map"].values()))
        except (bounded.InputError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return [index.name + " (unreadable)"]
        return [s for s in shards if not (snap / s).is_file()]
    return [] if any(snap.glob("*.safetensors")) else ["model.safetensors"]


# What config resolution reads of a checkpoint (config, quant config, tokenizer, the shard index): all a runner
# fetches of a checkpoint it has too few GPUs to serve.
CONFIG_PATTERNS = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja")


def resolve_hub(repo: str, revision: str, configs_only: bool = False) -> Path:
    """Find repo@revision in the local HF cache (the layout huggingface_hub writes), never the network.
    `configs_only`: a snapshot with its config files is enough (config-level checks read nothing else)."""
    bad = bad_hub_repo(repo) or bad_hub_revision(revision)
    if bad:
        raise CheckpointUnavailable(f"{repo}@{revision}: {bad}")
    base = hub_cache() / f"models--{repo.replace('/', '--')}"
    commit = revision
    ref = base / "refs" / revision
    if ref.is_file():
        commit = ref.read_text().strip()
    snap = base / "snapshots" / commit
    if re.fullmatch(r"[0-9a-f]{40}", commit) and (snap / "config.json").is_file():
        missing = [] if configs_only else missing_shards(snap)
        if not missing:
            return snap
        raise CheckpointUnavailable(
            f"{repo}@{revision} is only partly in the local Hugging Face cache ({snap}): {len(missing)} weight "
            f"file(s) missing, e.g. {missing[0]} (an interrupted download); on a host with hub access run "
            f"{download_command(repo, revision)} again to resume it")
    raise CheckpointUnavailable(
        f"{repo}@{revision} is not in the local Hugging Face cache ({hub_cache()}); on a host with hub "
        f"access run: {download_command(repo, revision)}")
