"""A Buildkite pipeline fragment a vLLM maintainer adds to vLLM's CI (docs/ci.md): the cpu tier on CPU agents and
the gpu tier on agents tagged with each arch, both only for builds whose diff touches the paths in
data/buildkite.yaml, then one step that turns the merged report's matrix.md into a `buildkite-agent annotate`.

Every step checks out quantmatrix at one pinned commit and installs it beside the vLLM the build made (quantmatrix
never installs vLLM or torch), so the cases meet exactly the pull request's vLLM. A red cell fails its step; the
annotation step runs anyway and says which cells, with their repro bundles uploaded as artifacts.
"""

from __future__ import annotations

import copy
import dataclasses
import shlex
from importlib import resources
from typing import Any

import yaml

from quantmatrix.errors import MatrixError
from quantmatrix.schema.model import Matrix

REPORTS = "quantmatrix/reports"  # every step's run directory lies below it (the artifacts' paths)
_ANNOTATION_CAP = 1 << 20  # buildkite-agent annotate takes at most 1 MiB; matrix.md stays under it


@dataclasses.dataclass(frozen=True)
class Source:
    """Where the steps get quantmatrix: a git URL and the commit (or tag) they check out."""

    url: str
    ref: str
    matrix: str  # the matrix file, relative to the checkout


def settings() -> dict[str, Any]:
    """data/buildkite.yaml: the path filters and the agent queries."""
    text = resources.files("quantmatrix").joinpath("data/buildkite.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    missing = {"if_changed", "cpu", "gpu", "annotate"} - set(data)
    if missing:
        raise MatrixError(f"data/buildkite.yaml: missing {', '.join(sorted(missing))}")
    return data


def _setup(source: Source) -> list[str]:
    """Check out quantmatrix at the pinned ref and install it (no dependencies of vLLM's chosen)."""
    return [f"git clone --quiet {shlex.quote(source.url)} quantmatrix",
            f"git -C quantmatrix checkout --quiet {shlex.quote(source.ref)}",
            "python3 -m pip install --quiet -e ./quantmatrix",
            "cd quantmatrix",
            'export QUANTMATRIX_VLLM_COMMIT="$$BUILDKITE_COMMIT"']


def _run(source: Source, run_id: str, pytest_args: list[str]) -> list[str]:
    """Run the cases, then bundle every failure; the step's exit is the run's (1: red cells). The arch is
    detected, never declared: with --strict-hardware an agent without that GPU fails instead of skipping."""
    run = ["quantmatrix", "run", "--matrix", source.matrix, "--run-id", run_id]
    out = f"reports/{run_id}"
    return ["rc=0",
            f"{shlex.join(run + pytest_args)} || rc=$$?",
            f"if [ \"$$rc\" -eq 1 ]; then quantmatrix repro --failed --junit {out} --out {out}/bundles || true; fi",
            'exit "$$rc"']


def _step(label: str, key: str, conf: dict[str, Any], commands: list[str], if_changed: Any,
          agents: dict[str, str]) -> dict[str, Any]:
    return {"label": label, "key": key, "agents": agents, "if_changed": copy.deepcopy(if_changed),
            "timeout_in_minutes": conf["timeout_in_minutes"], "commands": commands,
            "artifact_paths": [f"{REPORTS}/**/*"]}


def pipeline(matrix: Matrix, source: Source) -> dict[str, Any]:
    """The fragment: a group holding the cpu step, one gpu step per arch, and the annotation step."""
    conf = settings()
    changed = conf["if_changed"]
    cpu = _step(":cpu: quantmatrix cpu tier", "quantmatrix-cpu", conf["cpu"],
                _setup(source) + _run(source, "buildkite-cpu", ["-m", "cpu", "-rs"]), changed,
                dict(conf["cpu"]["agents"]))
    steps = [cpu]
    for arch in matrix.archs:
        agents = {**conf["gpu"]["agents"], conf["gpu"]["arch_tag"]: arch.name}
        steps.append(_step(f":nvidia: quantmatrix {arch.name} ({arch.label})", f"quantmatrix-{arch.name}",
                           conf["gpu"], _setup(source) + _run(source, f"buildkite-{arch.name}",
                                                              ["-m", arch.name, "--strict-hardware", "-rs"]),
                           changed, agents))
    annotate = {"label": ":memo: quantmatrix report", "key": "quantmatrix-report",
                "depends_on": [s["key"] for s in steps], "allow_dependency_failure": True,
                "agents": dict(conf["annotate"]["agents"]), "if_changed": copy.deepcopy(changed),
                "timeout_in_minutes": conf["annotate"]["timeout_in_minutes"],
                "commands": _setup(source) + annotation_commands(), "artifact_paths": [f"{REPORTS}/report/**/*"]}
    return {"steps": [{"group": ":microscope: quantmatrix", "key": "quantmatrix", "steps": [*steps, annotate]}]}


def annotation_commands() -> list[str]:
    """Fetch every step's reports, merge them, and annotate the build with matrix.md (error style when a cell is
    red); the step fails as the report does. Runs from the quantmatrix checkout."""
    top = "reports"
    return [f"buildkite-agent artifact download {shlex.quote(REPORTS + '/**/*')} .. || true",
            "rc=0",
            f"quantmatrix report {top}/buildkite-* --out {top}/report --allow-bad-inputs || rc=$$?",
            'style=success; if [ "$$rc" -ne 0 ]; then style=error; fi',
            f"if [ -f {top}/report/matrix.md ]; then head -c {_ANNOTATION_CAP} {top}/report/matrix.md | "
            f'buildkite-agent annotate --style "$$style" --context quantmatrix; fi',
            'exit "$$rc"']


def dump(fragment: dict[str, Any]) -> str:
    """The fragment as YAML for `buildkite-agent pipeline upload` (or pasting into .buildkite/)."""
    head = "# quantmatrix for vLLM's Buildkite pipeline: generated by `quantmatrix ci buildkite` (docs/ci.md)\n"
    return head + yaml.safe_dump(fragment, sort_keys=False, width=200)
