"""The GPU runners are persistent and hold the HF token and the model cache, so no code from a pull request may
reach them. These checks read every workflow in .github/workflows as GitHub would and enforce:

- no workflow triggered by a pull request, an issue comment or another workflow's run uses a self-hosted
  runner, directly or through a reusable workflow it calls;
- least privilege: no workflow-wide permissions, each job states its own; checkout never leaves the token in
  .git/config; every action from another repository is pinned to a full commit SHA;
- the dispatch-only `vllm` input (code of the dispatcher's choosing on the runners) waits for the protected
  environment `custom-vllm`.

Each rule is also run against a deliberately unsafe workflow, so a rule that could never fail fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
UNTRUSTED = {"pull_request", "pull_request_target", "pull_request_review", "pull_request_review_comment",
             "issue_comment", "workflow_run"}
SHA = re.compile(r"[^@\s]+@[0-9a-f]{40}")


def _load(text: str) -> dict[str, Any]:
    data = yaml.safe_load(text)
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as a boolean
    return data


def _triggers(wf: dict[str, Any]) -> set[str]:
    on = wf["on"]
    return {on} if isinstance(on, str) else set(on)


def _self_hosted(job: dict[str, Any], called: dict[str, dict[str, Any]]) -> bool:
    """The job runs on a self-hosted runner, itself or in the local reusable workflow it calls."""
    runs_on = job.get("runs-on", [])
    labels = [runs_on] if isinstance(runs_on, str) else list(runs_on or [])
    if "self-hosted" in labels:
        return True
    uses = job.get("uses", "")
    if uses.startswith("./.github/workflows/"):
        inner = called[Path(uses).name]
        return any(_self_hosted(j, called) for j in inner["jobs"].values())
    return False


def problems(workflows: dict[str, dict[str, Any]]) -> list[str]:
    """Every breach of the rules above, as '<file>: <job>: <what>'."""
    out = []
    for name, wf in workflows.items():
        untrusted = _triggers(wf) & UNTRUSTED
        if "permissions" not in wf or wf["permissions"] not in ({}, None):
            out.append(f"{name}: workflow-wide permissions {wf.get('permissions')!r}: set them per job, top level {{}}")
        for job_name, job in wf["jobs"].items():
            where = f"{name}: {job_name}"
            if untrusted and _self_hosted(job, workflows):
                out.append(f"{where}: self-hosted runner under untrusted trigger(s) {sorted(untrusted)}")
            if "permissions" not in job:
                out.append(f"{where}: no job-level permissions")
            for step in job.get("steps", []):
                uses = step.get("uses", "")
                if uses and not uses.startswith("./") and not SHA.fullmatch(uses):
                    out.append(f"{where}: {uses} is not pinned to a commit SHA")
                if uses.startswith("actions/checkout@") and (step.get("with") or {}).get("persist-credentials") \
                        is not False:
                    out.append(f"{where}: checkout without persist-credentials: false")
        dispatch = wf["on"].get("workflow_dispatch") if isinstance(wf["on"], dict) else None
        if dispatch and "vllm" in (dispatch or {}).get("inputs", {}):
            gate = wf["jobs"].get("approve-vllm", {})
            if gate.get("environment") != "custom-vllm":
                out.append(f"{name}: the vllm input is not gated by the protected environment custom-vllm")
            for job_name, job in wf["jobs"].items():
                if _self_hosted(job, workflows) and "approve-vllm" not in job.get("needs", []):
                    out.append(f"{name}: {job_name}: runs a dispatched vLLM without waiting for approve-vllm")
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
UNGATED_VLLM = """
on: {workflow_dispatch: {inputs: {vllm: {type: string}}}}
permissions: {}
jobs:
  gpu:
    permissions: {}
    uses: ./.github/workflows/nightly-arch.yml
"""


@pytest.mark.parametrize("text, expected", [
    (PR_ON_GPU, ["bad.yml: steal: self-hosted runner under untrusted trigger(s) ['pull_request']"]),
    (PR_VIA_REUSABLE, ["bad.yml: steal: self-hosted runner under untrusted trigger(s) ['pull_request_target']"]),
    (LOOSE, ["bad.yml: workflow-wide permissions 'write-all': set them per job, top level {}",
             "bad.yml: build: no job-level permissions",
             "bad.yml: build: actions/checkout@v5 is not pinned to a commit SHA",
             "bad.yml: build: checkout without persist-credentials: false",
             "bad.yml: build: someone/action@main is not pinned to a commit SHA"]),
    (UNGATED_VLLM, ["bad.yml: the vllm input is not gated by the protected environment custom-vllm",
                    "bad.yml: gpu: runs a dispatched vLLM without waiting for approve-vllm"]),
], ids=["pr-on-gpu", "pr-via-reusable-workflow", "loose-permissions-and-pins", "ungated-vllm-input"])
def test_each_rule_catches_its_unsafe_workflow(text, expected):
    repo = _repo()
    assert problems({"bad.yml": _load(text), "nightly-arch.yml": repo["nightly-arch.yml"]}) == expected + [
        p for p in problems({"nightly-arch.yml": repo["nightly-arch.yml"]})]
