"""Reading a checkpoint nobody vouched for: safetensors headers checked the way the safetensors library checks
them (before anything trusts an offset), config files of the wrong JSON type, and `re:` patterns that could
backtrack for hours. Every refusal is a LintError naming the file (and the tensor or key), never a traceback,
a hang or memory out of proportion to the file."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

try:  # the regex parser: public-ish in every CPython we run on, private name since 3.11
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse  # type: ignore[no-redef]

from quantmatrix.errors import QuantmatrixError

# safetensors' own limit on the header (its MAX_HEADER_SIZE), and the dtypes it knows, with their sizes
MAX_HEADER = 100_000_000
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "U8": 1, "I8": 1,
               "I16": 2, "I32": 4, "I64": 8, "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E8M0": 1, "F4": 1}


class LintError(QuantmatrixError):
    """The checkpoint cannot be linted (no files, unreadable config, unknown format)."""


def regular_file(file: Path, root: Path) -> None:
    """A plain file inside `root`: a directory or FIFO named *.safetensors, or a link out of the checkpoint
    directory, is refused before it is opened."""
    real = file.resolve()
    if root.resolve() not in real.parents:
        raise LintError(f"{file}: links outside the checkpoint directory ({real})")
    mode = os.stat(real).st_mode
    if not stat.S_ISREG(mode):
        raise LintError(f"{file}: not a regular file")


def _entry(file: Path, name: str, meta: Any, data_len: int) -> tuple[str, tuple[int, ...], int, int]:
    where = f"{file}: tensor {name!r}"
    if not isinstance(meta, dict):
        raise LintError(f"{where}: header entry is {type(meta).__name__}, not an object")
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise LintError(f"{where}: dtype {str(dtype)[:40]!r} is not a safetensors dtype")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise LintError(f"{where}: shape must be a list of non-negative integers, got {str(shape)[:60]}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise LintError(f"{where}: data_offsets must be [begin, end] integers, got {str(offsets)[:60]}")
    begin, end = offsets
    if not 0 <= begin <= end <= data_len:
        raise LintError(f"{where}: data_offsets {offsets} lie outside the {data_len} data bytes")
    nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
    if dtype != "F4" and end - begin != nbytes:
        raise LintError(f"{where}: {dtype}{shape} needs {nbytes} bytes, data_offsets give {end - begin}")
    return dtype, tuple(shape), begin, end


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
    return [(name, dtype, shape, 8 + n + begin) for name, dtype, shape, begin, _ in entries]


def json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON file that must hold an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise LintError(f"{path}: cannot read {what} ({str(e)[:200]})") from None
    if not isinstance(data, dict):
        raise LintError(f"{path}: {what} is {type(data).__name__}, not an object")
    return data


def _nested_repeat(items: Any, inside: bool) -> bool:
    for op, av in items:
        if op in (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT):
            lo, hi, sub = av
            unbounded = hi == sre_parse.MAXREPEAT or hi > 1
            if unbounded and inside:
                return True
            if _nested_repeat(sub, inside or unbounded):
                return True
        elif op == sre_parse.SUBPATTERN:
            if _nested_repeat(av[-1], inside):
                return True
        elif op == sre_parse.BRANCH:
            if any(_nested_repeat(b, inside) for b in av[1]):
                return True
        elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
            if _nested_repeat(av[1], inside):
                return True
    return False


def safe_regex(pattern: str, where: str) -> re.Pattern[str]:
    """A config's `re:` pattern, compiled; one with a repeat inside a repeat (`(a+)+`), which Python's engine
    can take exponential time on, is refused."""
    try:
        parsed = sre_parse.parse(pattern)
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise LintError(f"{where}: ignore pattern {pattern[:80]!r} is not a regular expression ({e})") from None
    if _nested_repeat(parsed, False):
        raise LintError(f"{where}: ignore pattern {pattern[:80]!r} nests a repeat inside a repeat, which can "
                        "backtrack for hours; write it without the nesting")
    return compiled
