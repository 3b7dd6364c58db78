"""Reading a checkpoint nobody vouched for: safetensors headers checked the way the safetensors library checks
them (before anything trusts an offset), config files of the wrong JSON type, and `re:` patterns that could
backtrack for hours. Every refusal is a LintError naming the file (and the tensor or key), never a traceback,
a hang or memory out of proportion to the file."""

from __future__ import annotations

import functools
import json
import os
import stat
from pathlib import Path
from typing import Any

import safetensors

from quantmatrix import bounded
from quantmatrix.errors import QuantmatrixError

# safetensors' own limit on the header (its MAX_HEADER_SIZE)
MAX_HEADER = 100_000_000
MAX_IGNORE = 10_000  # ignore-list entries: a real config has tens; each one is matched against every module


class LintError(QuantmatrixError):
    """The checkpoint cannot be linted (no files, unreadable config, unknown format)."""


def regular_file(file: Path, root: Path) -> None:
    """A plain file inside `root`: a directory or FIFO named *.safetensors, or a link out of the checkpoint
    directory, is refused before it is opened."""
    try:
        real = file.resolve(strict=True)
        mode = os.stat(real).st_mode
    except (OSError, RuntimeError) as e:  # a dangling link, a link loop (RuntimeError before Python 3.13)
        raise LintError(f"{file}: cannot be opened ({bounded.shown(e, 200)})") from None
    if root.resolve() not in real.parents:
        raise LintError(f"{file}: links outside the checkpoint directory ({real})")
    if not stat.S_ISREG(mode):
        raise LintError(f"{file}: not a regular file")


def _entry(file: Path, name: str, meta: Any, data_len: int) -> tuple[str, tuple[int, ...], int, int]:
    where = f"{file}: tensor {name!r}"
    if not isinstance(meta, dict):
        raise LintError(f"{where}: header entry is {type(meta).__name__}, not an object")
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if not isinstance(dtype, str) or not known_dtype(dtype):
        raise LintError(f"{where}: dtype {str(dtype)[:40]!r} is not a safetensors dtype (safetensors "
                        f"{safetensors.__version__} does not know it)")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise LintError(f"{where}: shape must be a list of non-negative integers, got {str(shape)[:60]}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise LintError(f"{where}: data_offsets must be [begin, end] integers, got {str(offsets)[:60]}")
    begin, end = offsets
    if not 0 <= begin <= end <= data_len:
        raise LintError(f"{where}: data_offsets {offsets} lie outside the {data_len} data bytes")
    return dtype, tuple(shape), begin, end


@functools.lru_cache(maxsize=256)
def known_dtype(dtype: str) -> bool:
    """Whether the installed safetensors reads `dtype`: asked of the library itself (an empty tensor of it
    deserialized), so a dtype it learns (C64, F6_E2M3) is accepted without a list here to keep up."""
    header = json.dumps({"t": {"dtype": dtype, "shape": [0], "data_offsets": [0, 0]}}).encode()
    try:
        safetensors.deserialize(len(header).to_bytes(8, "little") + header)
    except Exception:  # noqa: BLE001 - SafetensorError, or whatever a future release raises: not readable
        return False
    return True


def _library_check(file: Path) -> None:
    """The header as safetensors itself opens it (sizes per dtype, alignment, every rule of its release): a file
    the library refuses is one vLLM cannot load, whatever this module's own checks passed."""
    try:
        with safetensors.safe_open(str(file), "numpy"):
            pass
    except Exception as e:  # noqa: BLE001 - the library's refusal, whatever its type
        raise LintError(f"{file}: safetensors {safetensors.__version__} refuses the file: "
                        f"{bounded.shown(e, 300)}") from None


def read_header(file: Path, root: Path) -> list[tuple[str, str, tuple[int, ...], int]]:
    """[(name, dtype, shape, absolute data offset)] of one safetensors file, validated: header length
    within the cap and the file, a JSON object, known dtypes, integer shapes, offsets in range, and the tensors
    tiling the data exactly (contiguous, non-overlapping), as safetensors requires."""
    regular_file(file, root)
    size = file.stat().st_size
    with file.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise LintError(f"{file}: too short for a safetensors header")
        n = int.from_bytes(raw, "little")
        if n > MAX_HEADER or n > size - 8:
            raise LintError(f"{file}: header length {n} exceeds the file ({size} bytes) or the "
                            f"{MAX_HEADER}-byte cap")
        try:
            header = json.loads(fh.read(n))
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise LintError(f"{file}: unreadable safetensors header ({str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise LintError(f"{file}: the safetensors header is {type(header).__name__}, not an object")
    data_len = size - 8 - n
    entries = [(name, *_entry(file, name, meta, data_len)) for name, meta in header.items() if name != "__metadata__"]
    expect = 0
    for name, _, _, begin, end in sorted(entries, key=lambda e: (e[3], e[4])):
        if begin != expect:
            raise LintError(f"{file}: tensor {name!r} starts at byte {begin}, expected {expect}: the tensors "
                            "overlap or leave a gap")
        expect = end
    if expect != data_len:
        raise LintError(f"{file}: the tensors cover {expect} of {data_len} data bytes (truncated or padded)")
    _library_check(file)
    return [(name, dtype, shape, 8 + n + begin) for name, dtype, shape, begin, _ in entries]


def json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON file that must hold an object."""
    try:
        data = json.loads(bounded.read_text(path, "config"))
    except (bounded.InputError, ValueError, RecursionError) as e:
        raise LintError(f"{path}: cannot read {what} ({bounded.shown(e, 300)})") from None
    if not isinstance(data, dict):
        raise LintError(f"{path}: {what} is {type(data).__name__}, not an object")
    return data


def safe_regex(pattern: str, where: str) -> Any:
    """A config's `re:` pattern, compiled by RE2 (bounded.regex): matching is linear in the name whatever the
    pattern, so `(a+)+$` or `(.|.)*Z` cannot backtrack for hours; one RE2 cannot compile is a LintError."""
    try:
        return bounded.regex(pattern)
    except bounded.InputError as e:
        raise LintError(f"{where}: ignore pattern {pattern[:80]!r} is {e.why}") from None


def ignore_list(value: Any, where: Path) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """The config's ignore list (strings only, at most MAX_IGNORE) and its `re:` patterns compiled, in order."""
    if value is None:
        return (), ()
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise LintError(f"{where}: the ignore list must be a list of strings, got {str(value)[:80]}")
    if len(value) > MAX_IGNORE:
        raise LintError(f"{where}: the ignore list has {len(value)} entries, over the {MAX_IGNORE} this lint "
                        "matches against every module")
    return tuple(value), tuple(safe_regex(p[3:], str(where)) for p in value if p.startswith("re:"))


INDEX = "model.safetensors.index.json"


def read_index(path: Path) -> dict[str, str] | None:
    """The shard index's weight_map (tensor name -> shard file), None when the checkpoint has no index. vLLM loads
    exactly the shards it names; one that is not JSON, not a mapping of names to files, or names a file outside
    the directory is a LintError."""
    file = path / INDEX
    if not file.exists() and not file.is_symlink():
        return None
    regular_file(file, path)
    where = f"{file}"
    try:
        data = json.loads(bounded.read_bytes(file, "index"))
    except (bounded.InputError, ValueError, RecursionError) as e:
        raise LintError(f"{where}: cannot read the shard index ({bounded.shown(e, 300)})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise LintError(f"{where}: weight_map is {type(weight_map).__name__}, not an object of tensor name -> shard")
    root = path.resolve()
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise LintError(f"{where}: weight_map[{str(name)[:80]!r}] is {type(shard).__name__}, not a "
                            "file name")
        if "\x00" in shard or root not in (root / shard).resolve().parents:
            raise LintError(f"{where}: weight_map[{str(name)[:80]!r}] names {shard[:80]!r}, "
                            "outside the checkpoint directory")
    return weight_map
