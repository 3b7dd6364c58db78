"""`quantmatrix`: one command, every subcommand. Each module here registers its subcommands on the shared
parser (`register(sub)`, each parser with `set_defaults(run=...)`) and turns arguments into calls of the parts
below it; no verdict or file format lives here.

Exit status of every subcommand: 0 success, 1 findings (failures, lint findings, failed downloads), 2 the
command or its input was wrong, 3 an internal error (a bug in quantmatrix: the traceback goes to a log file, and
the exit code never looks like a verdict).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback

from quantmatrix.bounded import shown
from quantmatrix.cli import bisect, checkpoints, ci, docs, initcheck, matrix, report, repro
from quantmatrix.errors import QuantmatrixError

_MODULES = (matrix, report, checkpoints, bisect, initcheck, repro, ci, docs)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quantmatrix", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _MODULES:
        module.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args, rest = parser().parse_known_args(argv)
    except SystemExit as e:  # argparse: --help is 0, a usage error 2
        return 0 if e.code in (0, None) else 2
    if rest and not getattr(args, "passthrough", False):
        print(f"quantmatrix {args.command}: error: unrecognized arguments: {' '.join(rest)}", file=sys.stderr)
        return 2
    try:
        return int(args.run(args, rest) if getattr(args, "passthrough", False) else args.run(args))
    except QuantmatrixError as e:
        print(f"quantmatrix {args.command}: error: {printable(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `quantmatrix list | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # noqa: BLE001 - a bug is reported, never mistaken for a verdict
        return internal_error(args.command, e)


def printable(message: str) -> str:
    """An error message for the terminal: each of its lines escaped (bounded.shown), so a tensor name, a file name
    or a surrogate inside it can neither forge a line nor fail to print."""
    return "\n".join(shown(line) for line in message.split("\n"))


def internal_error(command: str, error: BaseException) -> int:
    """Exit 3 with one line on stderr and the traceback in a log file the line names."""
    fd, log = tempfile.mkstemp(prefix=f"quantmatrix-{command}-", suffix=".log")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f"quantmatrix {command} {' '.join(sys.argv[1:])}\n")
        f.write("".join(traceback.format_exception(error)))
    print(f"quantmatrix {command}: internal error, please report: {type(error).__name__}: {shown(error, 300)} "
          f"(traceback in {log})", file=sys.stderr)
    return 3
