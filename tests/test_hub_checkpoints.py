"""Hub checkpoints through the plugin: resolved from the local HF cache only, skipped with the download line when
absent, and failed instead under --strict-checkpoints (a runner that should hold them must not go quietly green).
The HF cache is a temp directory in the layout huggingface_hub writes; CUDA queries are faked to find no GPU."""

from __future__ import annotations

from xml.etree import ElementTree as ET

import pytest
from matrixkit import SMALL

from quantmatrix import properties as P
from quantmatrix.host import detect

COMMIT = "0123456789abcdef0123456789abcdef01234567"
HUB_MATRIX = SMALL.replace(
    "version: 1\n", "version: 1\nallow_floating_revisions: true  # `main` on purpose\n", 1).replace(
    "    source: {synthetic: {model: qwen3_moe}}\n    producer: modelopt\n    scheme: nvfp4_weight_only",
    "    source: {hub: example/moe-nvfp4, revision: main}\n    producer: modelopt\n    scheme: nvfp4_weight_only",
)
SUITE = """
def test_cpu_probe(cell, checkpoint_dir, record_property):
    record_property("checkpoint_dir", str(checkpoint_dir))
    assert (checkpoint_dir / "config.json").is_file()

def test_gpu_probe(cell):
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path) -> pytest.Pytester:
    assert "example/moe-nvfp4" in HUB_MATRIX
    monkeypatch.setattr(detect, "query_nvidia_smi", lambda: None)
    monkeypatch.setattr(detect, "query_torch", lambda: ([], "faked: no CUDA"))
    monkeypatch.delenv(detect.ARCH_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path / "qm"))
    pytester.makefile(".yaml", m=HUB_MATRIX)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def _cache(tmp_path) -> None:
    """example/moe-nvfp4@main as huggingface_hub leaves it: refs/main -> snapshots/<commit>/{config.json,
    model.safetensors} (a complete snapshot)."""
    base = tmp_path / "hub" / "models--example--moe-nvfp4"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(COMMIT)
    (base / "snapshots" / COMMIT).mkdir(parents=True)
    (base / "snapshots" / COMMIT / "config.json").write_text("{}")
    (base / "snapshots" / COMMIT / "model.safetensors").write_bytes(b"")


def test_absent_hub_checkpoint_skips_with_the_download_line(suite):
    """Not in the local cache: each of its cases is skipped, saying exactly what to run on a host with hub access."""
    result = suite.runpytest("--matrix", "m.yaml", "-rs", "-k", "cpu_probe and tiny-wo")
    result.assert_outcomes(skipped=6)
    result.stdout.fnmatch_lines(["*example/moe-nvfp4@main is not in the local Hugging Face cache*"
                                 "run: hf download example/moe-nvfp4 --revision main*"])


def test_strict_checkpoints_fails_an_absent_hub_checkpoint(suite):
    """--strict-checkpoints turns that skip into a failure (a setup error) carrying the same download line."""
    result = suite.runpytest("--matrix", "m.yaml", "-k", "cpu_probe and tiny-wo", "--strict-checkpoints")
    result.assert_outcomes(errors=6)
    result.stdout.fnmatch_lines(["*--strict-checkpoints: example/moe-nvfp4@main is not in the local Hugging "
                                 "Face cache*hf download example/moe-nvfp4 --revision main*"])


def test_strict_checkpoints_passes_a_cached_hub_checkpoint(suite, tmp_path):
    """In the cache, the case gets the snapshot directory, strict or not: nothing is downloaded at test time."""
    _cache(tmp_path)
    result = suite.runpytest("--matrix", "m.yaml", "-k", "cpu_probe and tiny-wo", "--strict-checkpoints",
                             "--junitxml", "j.xml", "-o", "junit_family=xunit1")
    result.assert_outcomes(passed=6)
    cases = ET.parse(suite.path / "j.xml").getroot().iter("testcase")
    props = [{p.get("name"): p.get("value") for p in case.iter("property")} for case in cases]
    assert len(props) == 6
    assert all((p[P.CHECKPOINT_REVISION], p[P.CHECKPOINT_SNAPSHOT]) == ("main", COMMIT) for p in props)


def test_strict_checkpoints_leaves_gpu_skips_to_strict_hardware(suite):
    """The two options are separate: an absent GPU still skips under --strict-checkpoints alone."""
    result = suite.runpytest("--matrix", "m.yaml", "-m", "gpu", "--strict-checkpoints")
    result.assert_outcomes(skipped=6)


CONFIG_SUITE = """
def test_cpu_probe(cell, config_dir, record_property):
    record_property("config_dir", str(config_dir))

def test_gpu_probe(cell, checkpoint_dir):
    pass
"""


def test_a_runner_too_small_to_serve_a_checkpoint_checks_its_configs_and_skips_its_files(
        suite, tmp_path, monkeypatch):
    """One GB10 and a checkpoint that needs two: the runner holds only its config files (what `quantmatrix
    fetch` leaves there). Config-level cases read them; file-level ones skip, naming both GPU counts, and do not
    fail even under --strict-checkpoints (the weights are missing on purpose)."""
    monkeypatch.setattr(detect, "query_nvidia_smi", lambda: [detect.Device(0, "NVIDIA GB10", (12, 1))])
    suite.makefile(".yaml", m=HUB_MATRIX.replace("    scheme: nvfp4_weight_only", "    scheme: nvfp4_weight_only\n"
                                                 "    gpus: 2", 1))
    suite.makepyfile(test_suite=CONFIG_SUITE)
    _cache(tmp_path)
    (tmp_path / "hub" / "models--example--moe-nvfp4" / "snapshots" / COMMIT / "model.safetensors").unlink()
    result = suite.runpytest("--matrix", "m.yaml", "-k", "tiny-wo and sm121", "--strict-checkpoints", "-rs",
                             "--junitxml", "j.xml", "-o", "junit_family=xunit1")
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines(["*tiny-wo needs 2 GPUs of sm121 (GB10 / DGX Spark); this host has 1, so this "
                                 "runner holds only its config files*"])
    dirs = {p.get("value") for p in ET.parse(suite.path / "j.xml").getroot().iter("property")
            if p.get("name") == "config_dir"}
    assert dirs == {str(tmp_path / "hub" / "models--example--moe-nvfp4" / "snapshots" / COMMIT)}
