"""The cross-arch comparison end to end, as a night runs it: the real plugin on two archs (two pytest runs, each
`--arch X -m X` over one small matrix, each writing JUnit), then the real `quantmatrix report` over both files.

The engine is the STAND-IN of tests/standin_vllm.py: its greedy tokens depend on the arch's `engine_args`
(`fake_kernel`): `reference` on sm120; on sm121 `near_tie` picks the reference's second choice at one position (a
flip within each other's top-k), `outside` picks a token the reference never ranked (what an arch-dependent bug
does).
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from standin_vllm import TESTS, install, two_arch_matrix

from quantmatrix import properties as P
from quantmatrix.cli import main

SRC = Path(__file__).resolve().parent.parent / "src"

MATRIX = two_arch_matrix("tiny")


@pytest.fixture
def night(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A project over the two-arch matrix with the stand-in vLLM first on PYTHONPATH; returns a function that
    runs both archs with the given sm121 kernel and merges their JUnit with `quantmatrix report`."""
    site = install(tmp_path / "fake-site")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(SRC)]))
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("QUANTMATRIX_ARCH", raising=False)
    pytester.makefile(".txt", prompts="first prompt\nsecond prompt\n")
    (pytester.path / "ck").mkdir()
    (pytester.path / "ck" / "config.json").write_text("{}")
    pytester.makepyfile(test_e2e=TESTS)

    def run(kernel: str) -> tuple[int, dict, str, list[Path]]:
        pytester.makefile(".yaml", m=MATRIX.replace("KERNEL", kernel))
        files = []
        for arch in ("sm120", "sm121"):
            junit = pytester.path / f"{kernel}-{arch}.xml"
            result = pytester.runpytest_subprocess("--matrix", "m.yaml", "--arch", arch, "-m", arch,
                                                   "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                                                   f"--junitxml={junit}")
            result.assert_outcomes(passed=1)
            files.append(junit)
        out = tmp_path / f"report-{kernel}"
        code = main(["report", *map(str, files), "--out", str(out), "--night", kernel, "--date", "2026-12-02"])
        return code, json.loads((out / "summary.json").read_text()), (out / "matrix.md").read_text(), files

    return run


def _properties(junit: Path) -> list[list[str]]:
    return [[p.get("name", "") for p in tc.iter("property")] for tc in ET.parse(junit).iter("testcase")]


@pytest.mark.parametrize(("kernel", "red", "detail"), [
    ("outside", True, "prompt 0 diverges at token 2: 7002 vs 1002 (ranks >3 and >3 in each other's top-3)"),
    ("near_tie", False, "near-tie: prompt 0 diverges at token 2: 1102 vs 1002 (ranks 2 and 2 in each other's "
                        "top-3)"),
], ids=["outside", "near_tie"])
def test_the_merged_report_shows_the_archs_disagreement_red_only_outside_the_top_k(night, one_disagreement,
                                                                                   kernel, red, detail) -> None:
    """sm121's engine leaves sm120's tokens at prompt 0, token 2, and each arch's own degeneration case passes.
    `outside`: for a token sm120 never ranked, so the merged report marks the disagreement red (summary.json,
    matrix.md) and exits 1. `near_tie`: for sm120's second choice, while sm120's choice is sm121's second, so
    it is recorded and shown (≈, ≠ archs) and the night stays green. Both name both devices, and every case
    recorded each of its properties once."""
    code, s, md, files = night(kernel)
    assert one_disagreement(s, md, "sm121", red) == detail
    (d,) = s["disagreements"]
    assert (d["checkpoint"], d["mode"], d["check"]) == ("tiny", "default", "degeneration")
    assert ([r["arch"] for r in d["reference"]], d["differs"][0]["device"]) == (["sm120"], "declared GB10")
    assert code == int(red) and s["totals"]["passed"] == 2
    assert ("tiny / default / degeneration: sm121 (declared GB10) differs from sm120 (declared RTX PRO 6000): "
            + detail.replace(">", "\\>")) in md  # matrix.md escapes Markdown
    assert "≠ archs" in md
    for junit in files:
        (names,) = _properties(junit)
        assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
        assert {P.GREEDY_TOKEN_IDS, P.GREEDY_TOP_K, P.DEVICE_NAME} <= set(names)
