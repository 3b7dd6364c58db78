"""JUnit file edits the plugin makes after pytest wrote the file."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from xml.etree import ElementTree as ET

from quantmatrix.atomic import write_atomic
from quantmatrix.errors import QuantmatrixError


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
