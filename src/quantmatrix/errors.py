"""Every exception quantmatrix raises on purpose, in one place (structlog style)."""

from __future__ import annotations


class QuantmatrixError(Exception):
    """Base class: a message meant for a human, never a traceback."""


class MatrixError(QuantmatrixError):
    """A matrix file is malformed; the message starts with file:line:column."""


class OptionError(QuantmatrixError):
    """A command-line value is wrong (a usage error); the message names the flag."""


class AdapterMismatch(QuantmatrixError):
    """The installed vLLM no longer fits quantmatrix's adapter: fail loudly, never skip."""


class CheckpointUnavailable(QuantmatrixError):
    """A checkpoint cannot be materialised here (e.g. not in the local HF cache)."""


class ReportError(QuantmatrixError):
    """The nightly report cannot be made as asked (bad arguments, an unreadable previous summary)."""


class BisectError(QuantmatrixError):
    """A bisect cannot start as asked: an unknown release or case, an unreadable index or report."""


class SanitizerLogError(QuantmatrixError):
    """A compute-sanitizer report or parameter record cannot be read whole: the message names the file and line."""


class ReproError(QuantmatrixError):
    """A repro bundle cannot be made as asked: an unknown case, a record without what the script needs, code the
    lifter cannot carry into a standalone script."""
