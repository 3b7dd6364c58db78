"""Where the checkout is: the directory holding suites/ and matrices/ (the defaults of every subcommand)."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantmatrix.errors import QuantmatrixError
from quantmatrix.pytest_plugin.options import TRUST_MATRIX
from quantmatrix.schema.load import DEFAULT_MATRIX, MATRICES


def project_root() -> Path:
    """From the working directory up, else from this package's own location (an editable install)."""
    for start in (Path.cwd(), Path(__file__).resolve()):
        for d in (start, *start.parents):
            if (d / "suites").is_dir() and (d / DEFAULT_MATRIX).is_file():
                return d
    raise QuantmatrixError(f"cannot find the quantmatrix checkout (a directory with suites/ and {DEFAULT_MATRIX}); "
                           "run from inside it")


def default_matrix(name: str = DEFAULT_MATRIX.name) -> Path:
    return project_root() / MATRICES / name


def add_trust(parser: argparse.ArgumentParser) -> None:
    """The plugin's --trust-matrix, for a subcommand that loads a matrix (read back as `args.trust_matrix`)."""
    parser.add_argument(TRUST_MATRIX.name, action="store_true", help=TRUST_MATRIX.help)
