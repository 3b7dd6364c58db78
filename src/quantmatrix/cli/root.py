"""Where the checkout is: the directory holding suites/ and matrices/ (the defaults of every subcommand)."""

from __future__ import annotations

from pathlib import Path

from quantmatrix.errors import QuantmatrixError


def project_root() -> Path:
    """From the working directory up, else from this package's own location (an editable install)."""
    for start in (Path.cwd(), Path(__file__).resolve()):
        for d in (start, *start.parents):
            if (d / "suites").is_dir() and (d / "matrices" / "default.yaml").is_file():
                return d
    raise QuantmatrixError("cannot find the quantmatrix checkout (a directory with suites/ and "
                           "matrices/default.yaml); run from inside it")


def default_matrix(name: str = "default.yaml") -> Path:
    return project_root() / "matrices" / name
