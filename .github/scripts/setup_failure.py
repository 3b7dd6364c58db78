"""Record why an arch job could not test, as a JUnit file the nightly report reads (one red line, with its cause),
instead of an exit code the report never sees. Standard library only: it runs where the install itself failed.

    python3 setup_failure.py ARCH CAUSE DETAIL OUT_XML

CAUSE is one of quantmatrix.properties.CAUSES: install (pip could not install the vLLM under test), vllm_import
(it installed but does not import), no_wheel (the plan has no wheel for this CPU architecture at this commit),
refused (the runner guard refused the job), pytest (pytest could not test: usage error, nothing collected, crash).
The file holds no test case: the testsuite properties `setup_failure` (`<cause>: <detail>`), `arch` and `runner`.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

CAUSES = ("install", "vllm_import", "no_wheel", "refused", "pytest")


def record(arch: str, cause: str, detail: str) -> bytes:
    if cause not in CAUSES:
        raise SystemExit(f"setup_failure: cause {cause!r} is not one of {', '.join(CAUSES)}")
    root = ET.Element("testsuites")
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    suite = ET.SubElement(root, "testsuite", name="setup", tests="0", failures="0", errors="0", skipped="0",
                          timestamp=stamp)
    props = ET.SubElement(suite, "properties")
    runner = os.environ.get("RUNNER_NAME") or socket.gethostname()
    detail = " ".join(detail.split())[:2000]  # one line: the report shows it as one
    for name, value in (("setup_failure", f"{cause}: {detail}"), ("arch", arch), ("runner", runner)):
        ET.SubElement(props, "property", name=name, value=value)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    arch, cause, detail, out = argv
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(record(arch, cause, detail))
    print(f"::error::{arch} not tested ({cause}): {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
