"""A case's two spellings: the pytest node id `quantmatrix list` prints (`suites/test_x.py::test_y[CELL]`) and the
key JUnit and summary.json file it under (`suites.test_x::test_y[CELL]`, classname::name). Every command that
takes a case id (bisect, repro) accepts both."""

from __future__ import annotations

from quantmatrix.errors import QuantmatrixError


def node_id(case_id: str) -> str:
    """A pytest node id from either spelling."""
    path, sep, rest = case_id.partition("::")
    if not sep or not rest:
        raise QuantmatrixError(f"case {case_id!r}: expected FILE::TEST[PARAMS] as `quantmatrix list` or the report "
                               "names it, e.g. suites/test_dispatch.py::test_config_dispatch[CELL]")
    if not path.endswith(".py"):
        path = path.replace(".", "/") + ".py"
    return f"{path}::{rest}"


def report_key(case_id: str) -> str:
    """summary.json's and JUnit's key of a case from either spelling."""
    path, _, rest = node_id(case_id).partition("::")
    return f"{path.removesuffix('.py').replace('/', '.')}::{rest}"
