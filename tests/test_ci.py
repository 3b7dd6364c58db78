"""`quantmatrix ci buildkite`: the fragment validates against Buildkite's published pipeline schema (vendored as
test data in tests/data/buildkite/), carries the path filters and agent queries of data/buildkite.yaml, and its
annotation step's shell, run here with `buildkite-agent` replaced by a recorder and the real `quantmatrix report`,
annotates the build with the merged report's matrix.md."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from quantmatrix.ci import buildkite
from quantmatrix.cli import main
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "tests" / "data" / "buildkite" / "schema.json").read_text(encoding="utf-8"))
REF = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def fragment(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bk") / "pipeline.yml"
    assert main(["ci", "buildkite", "--source", "https://git.example/quantmatrix.git", "--ref", REF,
                 "--out", str(out)]) == 0
    return yaml.safe_load(out.read_text(encoding="utf-8"))


def _steps(fragment: dict) -> list[dict]:
    (group,) = fragment["steps"]
    return group["steps"]


def test_the_fragment_validates_against_buildkites_published_schema(fragment):
    jsonschema.Draft7Validator(SCHEMA).validate(fragment)
    broken = json.loads(json.dumps(fragment))
    _steps(broken)[0]["timeout_minutes"] = 60  # a misspelt key is refused: the validation can fail
    with pytest.raises(jsonschema.ValidationError, match="timeout_minutes"):
        jsonschema.Draft7Validator(SCHEMA).validate(broken)


def test_the_cpu_tier_and_one_gpu_step_per_arch_run_only_where_quantization_or_fused_moe_changed(fragment):
    conf = buildkite.settings()
    steps = _steps(fragment)
    archs = [a.name for a in load(ROOT / "matrices" / "default.yaml").archs]
    assert [s["key"] for s in steps] == ["quantmatrix-cpu", *(f"quantmatrix-{a}" for a in archs),
                                         "quantmatrix-report"]
    assert all(s["if_changed"] == conf["if_changed"] for s in steps)
    assert any("fused_moe" in p for p in conf["if_changed"]["include"])
    cpu, *gpu, annotate = steps
    assert cpu["agents"] == conf["cpu"]["agents"] and "-m cpu" in " ".join(cpu["commands"])
    for arch, step in zip(archs, gpu, strict=True):
        assert step["agents"] == {**conf["gpu"]["agents"], conf["gpu"]["arch_tag"]: arch}
        run = next(c for c in step["commands"] if c.startswith("quantmatrix run"))
        assert f"-m {arch} --strict-hardware" in run and "--arch" not in run
    for step in [cpu, *gpu]:
        assert f"git -C quantmatrix checkout --quiet {REF}" in step["commands"]
        assert step["artifact_paths"] == [f"{buildkite.REPORTS}/**/*"]
    assert annotate["depends_on"] == [s["key"] for s in [cpu, *gpu]] and annotate["allow_dependency_failure"]


def _tool(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="0" tests="2" time="2.0"
 timestamp="2026-12-01T02:17:00+00:00" hostname="cpu-agent"><properties>
<property name="vllm_version" value="0.32.0"/></properties>
<testcase classname="suites.test_dispatch" name="test_config_dispatch[a@sm121-default]" time="1.0"><properties>
<property name="check" value="config_dispatch"/><property name="cell" value="a@sm121-default"/>
<property name="arch" value="sm121"/><property name="mode" value="default"/></properties>
<failure message="a@sm121-default config_dispatch: resolved w4a4, expected weight_only">x</failure></testcase>
<testcase classname="suites.test_dispatch" name="test_config_dispatch[b@sm121-default]" time="1.0"><properties>
<property name="check" value="config_dispatch"/><property name="cell" value="b@sm121-default"/>
<property name="arch" value="sm121"/><property name="mode" value="default"/></properties></testcase>
</testsuite></testsuites>
"""


@pytest.mark.parametrize("red", [True, False])
def test_the_annotation_step_annotates_the_build_with_the_merged_report(fragment, tmp_path, red):
    """The step's commands as the agent runs them (Buildkite turns `$$` into `$` at upload), from the checkout."""
    build = tmp_path / "build"
    checkout = build / "quantmatrix"
    runs = checkout / "reports" / "buildkite-cpu"
    runs.mkdir(parents=True)
    junit = JUNIT if red else JUNIT.replace('failures="1"', 'failures="0"').split("<failure")[0] + \
        "</testcase>" + JUNIT.split("</testcase>", 1)[1]
    (runs / "junit.xml").write_text(junit, encoding="utf-8")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    _tool(bin_ / "buildkite-agent", f'echo "$*" >> {tmp_path}/agent.args\n'
          f'if [ "$1" = annotate ]; then cat > {tmp_path}/annotation.md; fi\n')
    _tool(bin_ / "quantmatrix", f'exec {sys.executable} -m quantmatrix.cli "$@"\n')
    commands = _steps(fragment)[-1]["commands"]
    script = "\n".join(c.replace("$$", "$") for c in commands[commands.index("cd quantmatrix") + 1:])
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT / "src"), "BUILDKITE_COMMIT": "f" * 40}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=checkout, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == (1 if red else 0), proc.stdout + proc.stderr
    args = (tmp_path / "agent.args").read_text().splitlines()
    assert args[0].startswith("artifact download")
    assert args[1] == f"annotate --style {'error' if red else 'success'} --context quantmatrix"
    annotation = (tmp_path / "annotation.md").read_text()
    assert annotation == (runs.parent / "report" / "matrix.md").read_text()
    assert ("config_dispatch[a@sm121-default]" in annotation) == red
