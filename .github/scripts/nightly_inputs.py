"""Refuse a nightly dispatch's inputs before anything uses them: every input reaches shell scripts, step outputs
and the GPU runners. Standard library only (the plan job runs it on a bare runner).

    python3 nightly_inputs.py --matrix "matrices/default.yaml matrices/real.yaml" --archs "sm120 sm121" \
      --known "sm90 sm100 sm120 sm121"

matrix: space-separated files matrices/<name>.yaml that exist in the checkout; archs: space-separated names from
--known (the nightly's arch jobs). A newline, or any other character, is refused with the input named. The vLLM
spec is checked by vllm_plan.py, which reads it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

MATRIX = re.compile(r"matrices/[a-z0-9][a-z0-9_-]{0,63}\.yaml")
ARCH = re.compile(r"[a-z0-9_]{1,32}")


def problems(matrix: str, archs: str, known: set[str], root: Path) -> list[str]:
    out = []
    if not re.fullmatch(r"[A-Za-z0-9_./ -]*", matrix) or not matrix.split():
        out.append(f"matrix {matrix[:100]!r}: space-separated matrices/<name>.yaml files only")
    for m in matrix.split():
        if not MATRIX.fullmatch(m) or not (root / m).is_file():
            out.append(f"matrix {m[:100]!r}: not a matrices/<name>.yaml file of this checkout")
    if not re.fullmatch(r"[a-z0-9_ ]*", archs):
        out.append(f"archs {archs[:100]!r}: space-separated arch names only")
    for a in archs.split():
        if not ARCH.fullmatch(a) or a not in known:
            out.append(f"archs: {a[:40]!r} is not one of {' '.join(sorted(known))}")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", required=True)
    parser.add_argument("--archs", default="")
    parser.add_argument("--known", required=True)
    args = parser.parse_args(argv)
    found = problems(args.matrix, args.archs, set(args.known.split()), Path.cwd())
    for p in found:
        print(f"::error::nightly input refused: {p}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
