"""Reading and showing what nobody vouched for, in one place: every file a command or plugin reads comes through
`read_bytes` (a regular file only, never a FIFO, device or /proc file, and never more than the cap of its kind,
stated in the error), every `re:` pattern through `regex` (RE2: linear time, so no pattern can hang), and every
untrusted string a terminal, matrix.md or a page shows through `shown` (control characters, escape sequences and
lone surrogates written as escapes, so a name cannot forge a line)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from quantmatrix.errors import QuantmatrixError

MIB = 1 << 20
# The most bytes a file of each kind may hold: far above any real one, far below what exhausts memory.
CAPS = {
    "matrix": 8 * MIB,  # a matrix, or the override file of QUANTMATRIX_GUARD_BACKENDS
    "prompts": 4 * MIB,
    "tasks": 64 * MIB,
    "config": 16 * MIB,  # config.json, hf_quant_config.json
    "index": 64 * MIB,  # model.safetensors.index.json (a 1T-parameter model's is ~10 MB)
    "junit": 1024 * MIB,
    "summary": 1024 * MIB,  # a previous night's summary.json
    "reference": 64 * MIB,
    "result": 256 * MIB,  # an engine child's result file
    "sanitizer_log": 8192 * MIB,  # compute-sanitizer's report, streamed (a healthy model's noise: ~4 kB a read)
    "bundle": 64 * MIB,  # a repro bundle's case.json (the report links the case it names)
}
REGEX_MEMORY = 8 * MIB  # RE2's memory budget for one compiled pattern
_READ_CHUNK = MIB


class InputError(QuantmatrixError):
    """A file or pattern refused before it is trusted; callers re-raise it as their own kind (MatrixError...).
    `why` is the reason alone (an OSError's strerror, the cap), the message is `<what>: <why>`."""

    def __init__(self, what: object, why: str) -> None:
        super().__init__(f"{what}: {why}")
        self.why = why


def read_bytes(path: str | Path, kind: str) -> bytes:
    """The bytes of `path`, a regular file of at most CAPS[kind] bytes. A FIFO is opened without blocking and
    refused, a device or directory refused, and a file that yields more than its size (/proc/self/environ reads
    as an empty regular file) refused: nothing here can hang or read without bound."""
    cap = CAPS[kind]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(path, f"not a regular file ({_file_kind(st.st_mode)}); a {kind} file must be one")
        if st.st_size > cap:
            raise InputError(path, f"{st.st_size} bytes, over the {cap // MIB} MiB cap for a {kind} file")
        chunks, got = [], 0
        while got <= st.st_size:
            chunk = os.read(fd, min(_READ_CHUNK, st.st_size + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from None
    finally:
        os.close(fd)
    if got > st.st_size:
        raise InputError(path, f"yields more than its {st.st_size} bytes (a /proc or growing file), not a "
                               f"{kind} file")
    return b"".join(chunks)


def check_file(path: str | Path, kind: str) -> None:
    """What read_bytes would refuse from the file's kind and size alone, without opening it (a matrix names a tasks
    file that a check reads later: a FIFO or an 8 GiB file is refused when the matrix loads)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(path, f"not a regular file ({_file_kind(st.st_mode)}); a {kind} file must be one")
    if st.st_size > CAPS[kind]:
        raise InputError(path, f"{st.st_size} bytes, over the {CAPS[kind] // MIB} MiB cap for a {kind} file")


def read_text(path: str | Path, kind: str) -> str:
    """read_bytes decoded as UTF-8; a bad byte is named by its offset."""
    data = read_bytes(path, kind)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(path, f"not UTF-8 (byte {e.start})") from None


def _file_kind(mode: int) -> str:
    for test, word in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return word
    return "not a plain file"


def regex(pattern: str) -> Any:
    """`pattern` compiled by RE2, whose matching is linear in the text whatever the pattern (`(.|.)*Z`, fifty
    `.*` in a row): a pattern RE2 cannot compile (a backreference, a lookaround, a repeat too large for its memory
    budget) is an InputError naming why."""
    import re2

    options = re2.Options()
    options.max_mem = REGEX_MEMORY
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except (re2.error, ValueError, TypeError, OverflowError, RecursionError) as e:
        why = e.args[0] if e.args else e
        why = why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
        raise InputError(repr(pattern[:80]), f"not a regular expression RE2 matches in linear time "
                                             f"({shown(why, 200)})") from None


def shown(text: object, limit: int | None = None) -> str:
    """`text` as one printable line: every character that is not printable (C0/C1 controls, ESC, NUL, DEL,
    newlines, bidi and other format characters, lone surrogates) written as a Python escape, and cut to `limit`
    characters with a count of the rest."""
    s = str(text)
    cut = ""
    if limit is not None and len(s) > limit:
        s, cut = s[:limit], f"... ({len(str(text)) - limit} more characters)"
    if s.isprintable():
        return s + cut
    return "".join(c if c.isprintable() else _escape(c) for c in s) + cut


def _escape(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"
