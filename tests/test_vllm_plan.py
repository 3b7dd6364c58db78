"""The nightly's plan job (.github/scripts/vllm_plan.py): one vLLM per night, a wheel per CPU architecture of one
commit. The wheel index is a local PEP 503 page read through file:// (no network here), laid out as vLLM's is:
<index>/nightly/vllm/ and <index>/<commit>/vllm/, with links relative to the page."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".github" / "scripts" / "vllm_plan.py"
_spec = importlib.util.spec_from_file_location("vllm_plan", SCRIPT)
vllm_plan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vllm_plan)

COMMIT = "66a168a19aa1f3a1b9c3e6d2f05e4c3b2a1d0e9f"


def _index(tmp_path: Path, page: str, wheels: list[str]) -> str:
    """An index page at <tmp>/<page>/vllm/ linking to ../../<commit>/<wheel>; returns the index root URL."""
    d = tmp_path / page / "vllm"
    d.mkdir(parents=True)
    links = "".join(f'<a href="../../{COMMIT}/{w.replace("+", "%2B")}#sha256=00">{w}</a><br/>\n' for w in wheels)
    (d / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    return tmp_path.as_uri()


def _plan(spec: str, index: str) -> dict[str, str]:
    return vllm_plan.plan(spec, index + "/")


def test_the_nightly_resolves_one_commit_with_a_wheel_for_each_cpu_architecture(tmp_path):
    """An older build is listed too; the newest version that has both architectures wins, and both URLs are of
    that one commit."""
    index = _index(tmp_path, "nightly", [
        "vllm-0.34.0.dev9+g11111111a-cp38-abi3-manylinux_2_31_x86_64.whl",
        "vllm-0.34.0.dev9+g11111111a-cp38-abi3-manylinux_2_31_aarch64.whl",
        "vllm-0.34.0.dev10+g66a168a19-cp38-abi3-manylinux_2_31_x86_64.whl",
        "vllm-0.34.0.dev10+g66a168a19-cp38-abi3-manylinux_2_31_aarch64.whl",
    ])
    got = _plan("", index)
    assert (got["kind"], got["commit"], got["version"]) == ("nightly", "66a168a19", "0.34.0.dev10+g66a168a19")
    assert got["x86_64"].endswith("vllm-0.34.0.dev10%2Bg66a168a19-cp38-abi3-manylinux_2_31_x86_64.whl")
    assert got["aarch64"].endswith("vllm-0.34.0.dev10%2Bg66a168a19-cp38-abi3-manylinux_2_31_aarch64.whl")
    assert got["x86_64"].startswith(tmp_path.as_uri() + f"/{COMMIT}/")


def test_a_night_with_an_architecture_missing_falls_back_to_the_newest_complete_build(tmp_path):
    index = _index(tmp_path, "nightly", [
        "vllm-0.34.0.dev9+g11111111a-cp38-abi3-manylinux_2_31_x86_64.whl",
        "vllm-0.34.0.dev9+g11111111a-cp38-abi3-manylinux_2_31_aarch64.whl",
        "vllm-0.34.0.dev10+g66a168a19-cp38-abi3-manylinux_2_31_x86_64.whl",
    ])
    assert _plan("", index)["commit"] == "11111111a"


def test_a_commit_without_an_aarch64_wheel_falls_back_per_architecture_naming_what_there_is(tmp_path):
    """An index that mirrors only the latest commit, its aarch64 build missing: x86_64 still tests that commit,
    aarch64 gets no wheel (its job reports "no wheel for this CPU architecture at this commit"), and the note
    names what the index had; the night is not lost for every arch."""
    index = _index(tmp_path, COMMIT, ["vllm-0.34.0.dev10+g66a168a19-cp38-abi3-manylinux_2_31_x86_64.whl"])
    got = _plan(COMMIT, index)
    assert (got["kind"], got["commit"], got["version"], got["aarch64"]) == (
        "commit", COMMIT, "0.34.0.dev10+g66a168a19", "")
    assert got["x86_64"].endswith("manylinux_2_31_x86_64.whl")
    assert got["note"].endswith("has no version with a wheel for every CPU architecture (x86_64: "
                                "0.34.0.dev10+g66a168a19; aarch64: none): 0.34.0.dev10+g66a168a19 planned for "
                                "x86_64; no wheel for aarch64 at this commit")


def test_an_index_without_any_vllm_wheel_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="lists no vLLM wheel"):
        _plan(COMMIT, _index(tmp_path, COMMIT, []))


def test_a_pinned_commit_reads_its_own_index(tmp_path):
    index = _index(tmp_path, COMMIT, [
        "vllm-0.34.0.dev10+g66a168a19-cp38-abi3-manylinux_2_31_x86_64.whl",
        "vllm-0.34.0.dev10+g66a168a19-cp38-abi3-manylinux_2_31_aarch64.whl",
    ])
    got = _plan(COMMIT, index)
    assert (got["kind"], got["commit"]) == ("commit", COMMIT)


@pytest.mark.parametrize(("spec", "kind", "x86", "commit"), [
    ("keep", "keep", "keep", ""),
    ("0.33.0", "release", "vllm==0.33.0", ""),
    ("https://w/vllm-0.34.0.dev6+g66a168a19-cp38-abi3-manylinux_2_31_x86_64.whl", "wheel",
     "https://w/vllm-0.34.0.dev6+g66a168a19-cp38-abi3-manylinux_2_31_x86_64.whl", "66a168a19"),
])
def test_keep_a_release_or_one_wheel_need_no_index(spec, kind, x86, commit):
    got = vllm_plan.plan(spec, "file:///nonexistent/")
    assert (got["kind"], got["x86_64"], got["aarch64"], got["commit"]) == (kind, x86, x86, commit)


def test_the_script_prints_step_outputs_and_refuses_nonsense():
    ok = subprocess.run([sys.executable, str(SCRIPT), "0.33.0"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.splitlines() == [
        "kind=release", "commit=", "version=0.33.0", "x86_64=vllm==0.33.0", "aarch64=vllm==0.33.0", "note="]
    bad = subprocess.run([sys.executable, str(SCRIPT), "main"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "is neither empty, keep, a version, a 40-hex commit nor a wheel" in bad.stderr


@pytest.mark.parametrize("spec", ["main; rm -rf ~", "0.33.0\nQUANTMATRIX_VLLM_WHEEL=evil", " 0.33.0",
                                  "$(id)", "x" * 501])
def test_a_spec_with_a_newline_or_shell_syntax_is_refused_before_anything_is_fetched(spec):
    """Nothing but a URL's characters reaches the step outputs (one line each) and pip."""
    bad = subprocess.run([sys.executable, str(SCRIPT), spec, "--index", "file:///nonexistent/"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stdout == ""
    assert "holds a character outside [A-Za-z0-9._~:/?#@%+=-] or is longer than 500" in bad.stderr
