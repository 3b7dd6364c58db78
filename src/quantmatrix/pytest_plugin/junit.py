"""JUnit file edits the plugin makes after pytest wrote the file."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from quantmatrix import properties as P
from quantmatrix.atomic import write_atomic
from quantmatrix.errors import QuantmatrixError
from quantmatrix.schema.model import Matrix


def matrix_name(matrix: Matrix, root: Path) -> str:
    """The matrix as every runner names it: its path from the project root (each runner's checkout lives
    elsewhere), else its absolute path."""
    try:
        return matrix.path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(matrix.path)


def matrix_cases(matrix: Matrix, root: Path, today: datetime.date) -> str:
    """The MATRIX_CASES record: every case the matrix defines, whatever this run selected, and the cases of
    each live waiver. The report tells from it a case the matrix no longer has (dropped) from one that went
    untested (red until the matrix or a waiver says otherwise)."""
    cases: dict[str, frozenset[str]] = {}
    waived: dict[str, dict[str, Any]] = {}  # by where the waiver is written: one entry per waiver
    for check in matrix.checks.values():
        found = matrix.cases(check)
        cases[check.name] = frozenset(c.cell.id for c in found)
        for c in found:
            w = c.waiver
            if w is not None and not w.expired(today):
                entry = waived.setdefault(w.where, {"reason": w.reason, "link": w.link, "expires": str(w.expires),
                                                    "cases": set()})
                entry["cases"].add(f"{check.name}[{c.cell.id}]")
    waivers = [dict(w, cases=frozenset(w["cases"])) for w in waived.values()]
    return P.encode_matrix_cases(P.MatrixCases(matrix_name(matrix, root), cases, waivers))


def stamp_testsuite_properties(xml_path: Path, props: Mapping[str, str]) -> None:
    """Add host-level <properties> to every <testsuite> of a finished JUnit file, atomically.

    record_testsuite_property is a no-op on xdist workers, so the controller stamps the file pytest wrote.
    Stamping twice updates values instead of repeating them.
    """
    xml_path = Path(xml_path)
    try:
        tree = ET.parse(xml_path)
    except (OSError, ET.ParseError) as e:
        raise QuantmatrixError(f"{xml_path}: cannot stamp suite properties: {e}") from None
    for suite in tree.getroot().iter("testsuite"):
        node = suite.find("properties")
        if node is None:
            node = ET.Element("properties")
            suite.insert(0, node)
        existing = {p.get("name"): p for p in node.iter("property")}
        for name, value in props.items():
            if name in existing:
                existing[name].set("value", str(value))
            else:
                ET.SubElement(node, "property", name=str(name), value=str(value))
    write_atomic(xml_path, ET.tostring(tree.getroot(), encoding="utf-8", xml_declaration=True))
