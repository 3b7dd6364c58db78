"""The GPU runners are persistent and hold the HF token and the model cache, so no code but the reviewed nightly
may reach them. These checks read every workflow in .github/workflows as GitHub would and enforce:

- a job reaches a self-hosted runner (any label list that is not only GitHub-hosted labels, a runner group, an
  expression; directly or through a reusable workflow it calls) only under `schedule` or `workflow_dispatch`:
  never under a pull request, an issue comment, another workflow's run, or a push (from any branch);
- such a dispatch, whatever its inputs, waits for a protected environment before any self-hosted job (each needs
  the approval job), and its `run-name` shows every input to the approver;
- the first step of every self-hosted job is the runner guard (.github/scripts/runner_guard.sh, which is also the
  runner's own job-started hook: docs/runners.md);
- no `run:` script expands an input or the event's payload (`${{ inputs.* }}`, `${{ github.event.* }}`): they reach
  scripts through `env:` only, where a newline or a quote is data;
- a workflow triggered by another workflow's run checks, in each job's `if`, that run's workflow path, repository,
  branch and event (a workflow named `nightly` elsewhere is not the nightly);
- least privilege: no workflow-wide permissions, each job states its own; checkout never leaves the token in
  .git/config; every action from another repository is pinned to a full commit SHA.

Each rule is also run against a deliberately unsafe workflow, so a rule that could never fail fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
GUARD = ROOT / ".github" / "scripts" / "runner_guard.sh"
TRUSTED = {"schedule", "workflow_dispatch", "workflow_call"}  # workflow_call: judged at its callers
PROTECTED = {"nightly-dispatch"}  # environments with required reviewers (docs/runners.md)
HOSTED = re.compile(r"(ubuntu|windows|macos)-[a-z0-9.-]+")
SHA = re.compile(r"[^@\s]+@[0-9a-f]{40}")
EXPANDS_UNTRUSTED = re.compile(r"\$\{\{[^}]*\b(inputs\.|github\.event\.|github\.head_ref)")
RUN_CHECKS = ("github.event.workflow_run.path ==", "github.event.workflow_run.repository.full_name ==",
              "github.event.workflow_run.head_branch ==", "github.event.workflow_run.event ==")


def _load(text: str) -> dict[str, Any]:
    data = yaml.safe_load(text)
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as a boolean
    return data


def _triggers(wf: dict[str, Any]) -> set[str]:
    on = wf["on"]
    return {on} if isinstance(on, str) else set(on)


def _direct(job: dict[str, Any]) -> bool:
    """The job itself runs on a runner that is not GitHub's: any label that is not a hosted image, a runner group,
    or an expression nobody can read statically."""
    runs_on = job.get("runs-on")
    if runs_on is None:
        return False
    if isinstance(runs_on, dict):
        return True  # {group: ..., labels: ...}: runner groups hold self-hosted runners
    labels = [runs_on] if isinstance(runs_on, str) else list(runs_on)
    return any("${{" in str(label) or not HOSTED.fullmatch(str(label)) for label in labels)


def _self_hosted(job: dict[str, Any], called: dict[str, dict[str, Any]]) -> bool:
    """The job runs on a self-hosted runner, itself or in the local reusable workflow it calls."""
    if _direct(job):
        return True
    uses = job.get("uses", "")
    if uses.startswith("./.github/workflows/"):
        inner = called[Path(uses).name]
        return any(_self_hosted(j, called) for j in inner["jobs"].values())
    return False


def _needs(job: dict[str, Any]) -> list[str]:
    needs = job.get("needs", [])
    return [needs] if isinstance(needs, str) else list(needs)


def _gated(name: str, jobs: dict[str, dict[str, Any]], seen: frozenset[str] = frozenset()) -> bool:
    """Job `name` waits, directly or through what it needs, for a job in a protected environment."""
    for need in _needs(jobs[name]):
        if need in seen:
            continue
        env = jobs[need].get("environment")
        env = env.get("name") if isinstance(env, dict) else env
        if env in PROTECTED or _gated(need, jobs, seen | {name}):
            return True
    return False


def _guard_body() -> str:
    return "\n".join(ln for ln in GUARD.read_text().splitlines() if not ln.startswith("#")).strip() + "\n"


def _job_problems(where: str, job: dict[str, Any]) -> list[str]:
    out = []
    if "permissions" not in job:
        out.append(f"{where}: no job-level permissions")
    steps = job.get("steps", [])
    if _direct(job) and (not steps or steps[0].get("run", "").strip() + "\n" != _guard_body()):
        out.append(f"{where}: self-hosted job whose first step is not the runner guard ({GUARD.name})")
    for step in steps:
        uses = step.get("uses", "")
        if uses and not uses.startswith("./") and not SHA.fullmatch(uses):
            out.append(f"{where}: {uses} is not pinned to a commit SHA")
        if uses.startswith("actions/checkout@") and (step.get("with") or {}).get("persist-credentials") is not False:
            out.append(f"{where}: checkout without persist-credentials: false")
        if EXPANDS_UNTRUSTED.search(step.get("run", "")):
            out.append(f"{where}: a run: script expands an input or the event payload; pass it through env:")
    return out


def problems(workflows: dict[str, dict[str, Any]]) -> list[str]:
    """Every breach of the rules above, as '<file>: <job>: <what>'."""
    out = []
    for name, wf in workflows.items():
        untrusted = _triggers(wf) - TRUSTED
        if "permissions" not in wf or wf["permissions"] not in ({}, None):
            out.append(f"{name}: workflow-wide permissions {wf.get('permissions')!r}: set them per job, top level {{}}")
        gpu = [j for j, job in wf["jobs"].items() if _self_hosted(job, workflows)]
        dispatch = "workflow_dispatch" in _triggers(wf)
        for job_name, job in wf["jobs"].items():
            where = f"{name}: {job_name}"
            if untrusted and job_name in gpu:
                out.append(f"{where}: self-hosted runner under trigger(s) {sorted(untrusted)}: only schedule and "
                           "an approved workflow_dispatch may reach a GPU runner")
            if dispatch and job_name in gpu and not _gated(job_name, wf["jobs"]):
                out.append(f"{where}: a dispatch reaches a self-hosted runner without waiting for a protected "
                           f"environment ({', '.join(sorted(PROTECTED))})")
            if "workflow_run" in _triggers(wf) and not all(c in str(job.get("if", "")) for c in RUN_CHECKS):
                out.append(f"{where}: triggered by a workflow run without checking its workflow path, repository, "
                           "branch and event")
            out += _job_problems(where, job)
        inputs = (wf["on"].get("workflow_dispatch") or {}).get("inputs", {}) if isinstance(wf["on"], dict) else {}
        shown = str(wf.get("run-name", ""))
        if gpu and inputs and not all(f"inputs.{i}" in shown for i in inputs):
            out.append(f"{name}: run-name does not show every input to the approver ({', '.join(inputs)})")
    return out


def _repo() -> dict[str, dict[str, Any]]:
    return {p.name: _load(p.read_text()) for p in sorted(WORKFLOWS.glob("*.yml"))}


def test_the_repository_workflows_keep_untrusted_code_off_the_gpu_runners():
    assert _repo(), "no workflows found"
    assert problems(_repo()) == []


def test_the_nightly_does_reach_the_self_hosted_runners():
    """The rules are not met by having no GPU job at all: the nightly's arch jobs do run self-hosted."""
    repo = _repo()
    assert any(_self_hosted(job, repo) for job in repo["nightly.yml"]["jobs"].values())


GUARDED = "[{run: 'guard'}]"  # a first step that is not the runner guard (so each case names its own breach)
PR_ON_GPU = """
on: {pull_request: {}}
permissions: {}
jobs:
  steal:
    permissions: {}
    runs-on: [self-hosted, gpu, sm121]
    steps: [{run: cat ~/.cache/huggingface/token}]
"""
PR_VIA_REUSABLE = """
on: [pull_request_target]
permissions: {}
jobs:
  steal:
    permissions: {}
    uses: ./.github/workflows/nightly-arch.yml
"""
LOOSE = """
on: {push: {}}
permissions: write-all
jobs:
  build:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v5
      - uses: someone/action@main
"""
UNGATED_INPUT = """
on: {workflow_dispatch: {inputs: {matrix: {type: string}}}}
run-name: nightly ${{ inputs.matrix }}
permissions: {}
jobs:
  gpu:
    permissions: {}
    uses: ./.github/workflows/nightly-arch.yml
"""
LABELS_WITHOUT_SELF_HOSTED = """
on: {pull_request: {}}
permissions: {}
jobs:
  steal:
    permissions: {}
    runs-on: [linux, gpu, sm120]
    steps: [{run: cat ~/.cache/huggingface/token}]
"""
RUNNER_GROUP = """
on: {issue_comment: {}}
permissions: {}
jobs:
  steal:
    permissions: {}
    runs-on: {group: quantmatrix-gpu}
    steps: [{run: cat ~/.cache/huggingface/token}]
"""
PUSH_FROM_A_BRANCH = """
on: {push: {branches: [main]}}
permissions: {}
jobs:
  gpu:
    permissions: {}
    uses: ./.github/workflows/nightly-arch.yml
"""
DISPATCH_UNSHOWN_UNGUARDED = """
on: {workflow_dispatch: {inputs: {vllm: {type: string}, archs: {type: string}}}}
run-name: nightly ${{ inputs.vllm }}
permissions: {}
jobs:
  approve:
    permissions: {}
    runs-on: ubuntu-latest
    environment: nightly-dispatch
    steps: [{run: echo ok}]
  gpu:
    needs: [approve]
    permissions: {}
    runs-on: [self-hosted, gpu, sm121]
    steps: [{run: pytest}]
"""
INPUT_IN_A_SCRIPT = """
on: {workflow_dispatch: {inputs: {vllm: {type: string}}}}
permissions: {}
jobs:
  plan:
    permissions: {}
    runs-on: ubuntu-latest
    steps: [{run: 'echo "QUANTMATRIX_VLLM_WHEEL=${{ inputs.vllm }}" >> "$GITHUB_ENV"'}]
"""
ANY_WORKFLOW_NAMED_NIGHTLY = """
on: {workflow_run: {workflows: [nightly], types: [completed]}}
permissions: {}
jobs:
  report:
    if: ${{ github.event.workflow_run.conclusion != 'cancelled' }}
    permissions: {actions: read}
    runs-on: ubuntu-latest
    steps: [{run: gh run download}]
"""
NOT_GUARDED = "self-hosted job whose first step is not the runner guard (runner_guard.sh)"


@pytest.mark.parametrize("text, expected", [
    (PR_ON_GPU, ["bad.yml: steal: self-hosted runner under trigger(s) ['pull_request']: only schedule and an "
                 "approved workflow_dispatch may reach a GPU runner", f"bad.yml: steal: {NOT_GUARDED}"]),
    (PR_VIA_REUSABLE, ["bad.yml: steal: self-hosted runner under trigger(s) ['pull_request_target']: only schedule "
                       "and an approved workflow_dispatch may reach a GPU runner"]),
    (LOOSE, ["bad.yml: workflow-wide permissions 'write-all': set them per job, top level {}",
             "bad.yml: build: no job-level permissions",
             "bad.yml: build: actions/checkout@v5 is not pinned to a commit SHA",
             "bad.yml: build: checkout without persist-credentials: false",
             "bad.yml: build: someone/action@main is not pinned to a commit SHA"]),
    (UNGATED_INPUT, ["bad.yml: gpu: a dispatch reaches a self-hosted runner without waiting for a protected "
                     "environment (nightly-dispatch)"]),
    (LABELS_WITHOUT_SELF_HOSTED, ["bad.yml: steal: self-hosted runner under trigger(s) ['pull_request']: only "
                                  "schedule and an approved workflow_dispatch may reach a GPU runner",
                                  f"bad.yml: steal: {NOT_GUARDED}"]),
    (RUNNER_GROUP, ["bad.yml: steal: self-hosted runner under trigger(s) ['issue_comment']: only schedule and an "
                    "approved workflow_dispatch may reach a GPU runner", f"bad.yml: steal: {NOT_GUARDED}"]),
    (PUSH_FROM_A_BRANCH, ["bad.yml: gpu: self-hosted runner under trigger(s) ['push']: only schedule and an "
                          "approved workflow_dispatch may reach a GPU runner"]),
    (DISPATCH_UNSHOWN_UNGUARDED, [f"bad.yml: gpu: {NOT_GUARDED}",
                                  "bad.yml: run-name does not show every input to the approver (vllm, archs)"]),
    (INPUT_IN_A_SCRIPT, ["bad.yml: plan: a run: script expands an input or the event payload; pass it through "
                         "env:"]),
    (ANY_WORKFLOW_NAMED_NIGHTLY, ["bad.yml: report: triggered by a workflow run without checking its workflow path, "
                                  "repository, branch and event"]),
], ids=["pr-on-gpu", "pr-via-reusable-workflow", "loose-permissions-and-pins", "ungated-dispatch-input",
        "labels-without-self-hosted", "runner-group", "push-from-a-branch", "dispatch-unshown-and-unguarded",
        "input-expanded-in-a-script", "any-workflow-named-nightly"])
def test_each_rule_catches_its_unsafe_workflow(text, expected):
    repo = _repo()
    assert problems({"bad.yml": _load(text), "nightly-arch.yml": repo["nightly-arch.yml"]}) == expected + [
        p for p in problems({"nightly-arch.yml": repo["nightly-arch.yml"]})]


def test_the_guard_step_of_the_arch_job_is_the_runner_hook_script_line_for_line():
    """The first step of the GPU job and the runner's job-started hook are one script: the hook is what no
    branch's YAML can remove, the step what a reader of the workflow sees."""
    job = _repo()["nightly-arch.yml"]["jobs"]["gpu"]
    assert job["steps"][0]["name"] == "Runner guard"
    assert job["steps"][0]["run"] == _guard_body()
