"""matrices/real.yaml, the public NVFP4 MoE checkpoints the runners cover, and the schema fields it adds
(size_gb, min_gpu_memory_gb): it loads, lists, is collected in full and skipped with the
download line where the local HF cache lacks a checkpoint, and its copied axes cannot drift from the default's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from matrixkit import GPUS_MATRIX, SMALL, write

from quantmatrix import cli
from quantmatrix.errors import MatrixError
from quantmatrix.host import sanitizer
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "matrices" / "real.yaml"
DEFAULT = ROOT / "matrices" / "default.yaml"


@pytest.fixture(scope="module")
def real():
    return load(REAL)


# The expectations both matrices must state alike; the e2e ones differ on purpose (real models: engine references,
# tighter top-k, thresholds per checkpoint).
DISPATCH_KEYS = ("quant_method", "resolves_to", "activation_scales", "audit", "moe_backend", "lint")


def test_real_matrix_copies_the_default_axes_exactly(real):
    """archs, modes, moe_backends and the schemes it uses are copies (no include mechanism): equal, or this fails."""
    default = load(DEFAULT)
    assert real.archs == default.archs  # engine_args may differ (not part of an arch's identity)
    assert real.modes == default.modes
    assert real.moe_backends == default.moe_backends
    assert real.schemes
    for name, scheme in real.schemes.items():
        theirs = default.schemes[name]
        assert (scheme.marker, scheme.label) == (theirs.marker, theirs.label)
        assert {k: scheme.expect.get(k) for k in DISPATCH_KEYS} == {k: theirs.expect.get(k) for k in DISPATCH_KEYS}


def test_real_matrix_names_every_suite_check(real):
    """Each check in suites/ must be in a matrix the suites run under (the plugin refuses a missing one)."""
    suites = {line.split("(")[0].removeprefix("def test_") for f in (ROOT / "suites").glob("test_*.py")
              for line in f.read_text().splitlines() if line.startswith("def test_")}
    assert suites == set(real.checks)


def test_real_checkpoints_are_pinned_hub_sources_of_both_schemes(real):
    """Every checkpoint comes from the hub at a 40-hex commit (real.yaml does not opt into floating refs),
    weight-only and W4A4 both appear, and each states the degeneration floor that catches the seed bug's one
    repeated token. (compressed-tensors left with RedHatAI/Qwen3-30B-A3B-NVFP4: no public report names its
    commit.)"""
    assert all(c.source.kind == "hub" and "/" in c.source.value[0] for c in real.checkpoints)
    assert all(re.fullmatch(r"[0-9a-f]{40}", c.source.value[1]) for c in real.checkpoints)
    assert "allow_floating_revisions" not in yaml.safe_load(REAL.read_text())
    assert {c.scheme.name for c in real.checkpoints} == {"nvfp4_weight_only", "nvfp4_w4a4"}
    assert all(c.expectation("degeneration")["max_repeat_run"] < real.e2e.max_tokens for c in real.checkpoints)
    assert all(c.expectation("reference") == "engine" for c in real.checkpoints)
    weight_only = [c for c in real.checkpoints if c.scheme.name == "nvfp4_weight_only"]
    assert [c.source.value[0] for c in weight_only] == ["LibertAIDAI/GLM-5.3-Flash-NVFP4",
                                                       "nvidia/Qwen3.6-35B-A3B-NVFP4"]


def test_a_single_gpu_weight_only_checkpoint_runs_every_e2e_check_in_every_mode(real):
    """The seed bug's shape end to end: a weight-only checkpoint on one GPU meets every e2e check of the greedy
    output in every mode that generates it (mode_invariance in every mode but the reference one), the poison modes
    included, and uninit_reads in every sanitized mode (whose run generates 2 tokens: uninit_reads' alone)."""
    one_gpu = [c for c in real.checkpoints if c.scheme.name == "nvfp4_weight_only" and c.gpus == 1]
    assert one_gpu
    e2e = [k for k in real.checks.values() if k.kind == "e2e"]
    generating = {m.name for m in real.modes if m.sanitizer is None}
    sanitized = {m.name for m in real.modes if m.sanitizer is not None}
    assert sanitized and len(e2e) == 5
    for ck in one_gpu:
        for check in e2e:
            modes = {case.cell.mode.name for case in real.cases(check) if case.cell.checkpoint is ck}
            want = sanitized if check.name == "uninit_reads" else generating - (
                {real.e2e.reference_mode} if check.name == "mode_invariance" else set())
            assert modes == want, (ck.id, check.name)
    assert {"poison_zero", "poison_one", "poison_nan"} <= {m.name for m in real.modes}


def test_a_floating_revision_is_refused_unless_the_matrix_allows_it(tmp_path):
    """`main` moves under the nightly: refused with file:line:column and both ways out; accepted with the flag."""
    text = _hub("").replace("revision: 0123456789abcdef0123456789abcdef01234567", "revision: main")
    with pytest.raises(MatrixError, match=r":\d+:\d+: checkpoint '[^']+': revision 'main' of org/name is a "
                                          r"floating ref.*pin the 40-hex commit.*allow_floating_revisions: true"):
        load(write(tmp_path, text))
    floating = load(write(tmp_path, text.replace("version: 1\n", "version: 1\nallow_floating_revisions: true\n")))
    assert floating.checkpoints[1].source.value == ("org/name", "main")


def test_real_matrix_lists_through_the_cli(capsys, real):
    """`quantmatrix list --matrix matrices/real.yaml` shows every cell and its gpu-tier checks."""
    assert cli.main(["list", "--matrix", str(REAL)]) == 0
    out = capsys.readouterr().out
    assert all(f"{cell.id} " in out for cell in real.cells())
    assert "config_dispatch(gpu), checkpoint_lint(gpu)" in out
    cases = sum(len(real.cases(c)) for c in real.checks.values())
    assert f"{len(real.cells())} cells, {cases} cases from" in out


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "empty-hub"), "HF_HUB_OFFLINE": "1",
           "QUANTMATRIX_CACHE": str(tmp_path / "qm"), "PYTHONPATH": str(ROOT / "src")}
    env.pop("QUANTMATRIX_ARCH", None)
    return subprocess.run([sys.executable, "-m", "pytest", "suites", "--matrix", str(REAL), "-p", "no:cacheprovider",
                           "-q", "-rs", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_real_matrix_collects_every_case(tmp_path, real):
    """`pytest suites --matrix matrices/real.yaml` collects all 120 cases (nothing silently dropped); each check
    it opts out of (`schemes: []`) is one empty-parameter-set item that pytest skips, never a case."""
    proc = _pytest(tmp_path, "--collect-only")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    items = [line for line in proc.stdout.splitlines() if "::" in line]
    cases = [i for i in items if "@" in i]
    assert len(cases) == sum(len(real.cases(c)) for c in real.checks.values()) > 0
    opted_out = {i.split("::test_")[1].removesuffix("[NOTSET]") for i in items if i.endswith("[NOTSET]")}
    assert opted_out == {name for name, c in real.checks.items() if c.schemes == ()}
    assert len(items) == len(cases) + len(opted_out)


def test_real_cases_skip_with_the_download_line_on_an_arch_whose_cache_is_empty(tmp_path, real):
    """On a (declared) GB10 runner with an empty HF cache, each of its cases is skipped with the exact
    `hf download` line; --strict-checkpoints makes the same cases errors."""
    n = sum(1 for check in real.checks.values() if check.tier == "gpu" for case in real.cases(check)
            if case.cell.arch.name == "sm121")
    proc = _pytest(tmp_path, "--arch", "gb10", "-m", "sm121 and gpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # config and lint once (default mode) on each checkpoint; e2e (4 checks in every mode but the sanitized one, no
    # invariance of `default` against itself, and uninit_reads in the sanitized one) on the two that fit one GPU
    sanitized = sum(1 for case in real.cases(real.checks["uninit_reads"]) if case.cell.arch.name == "sm121")
    generating = len([m for m in real.modes if m.sanitizer is None])
    assert f"{n} skipped" in proc.stdout and sanitized == 2
    assert n == 2 * len(real.checkpoints) + 2 * (4 * generating - 1) + sanitized
    for c in real.checkpoints:
        repo, revision = c.source.value
        assert f"run: hf download {repo} --revision {revision}" in proc.stdout
    strict = _pytest(tmp_path, "--arch", "gb10", "-m", "sm121 and gpu", "--strict-checkpoints")
    # a runner without compute-sanitizer skips the sanitized cells for that first (only --strict-hardware fails them)
    untested = 0 if sanitizer.find() else sanitized
    assert strict.returncode == 1 and f"{n - untested} errors" in strict.stdout, strict.stdout
    assert not untested or f"{untested} skipped" in strict.stdout


# ------------------------------------------------------------------------------ the fields real.yaml adds


def _hub(extra: str, expect: str = "") -> str:
    old = "    source: {synthetic: {model: qwen3_moe}}\n    producer: modelopt\n    scheme: nvfp4_w4a4\n"
    assert old in SMALL
    return SMALL.replace(old, "    source: {hub: org/name, revision: 0123456789abcdef0123456789abcdef01234567}\n"
                              "    producer: modelopt\n"
                              f"    scheme: nvfp4_w4a4\n{extra}{expect}", 1)


def test_size_fields_load(tmp_path):
    m = load(write(tmp_path, _hub("    size_gb: 16.88\n    min_gpu_memory_gb: 25\n")))
    ck = m.checkpoints[1]
    assert (ck.size_gb, ck.min_gpu_memory_gb) == (16.88, 25.0)


@pytest.mark.parametrize(("text", "line", "fragment"), [
    (_hub("    size_gb: 0\n"), 28, "checkpoints[1].size_gb: expected a positive number, got 0"),
    (_hub("    size_gb: .nan\n"), 28, "expected a positive number, got nan"),
    (_hub("    size_gb: big\n"), 28, "expected a number, got str 'big'"),
    (_hub("    size_gb: 134\n    min_gpu_memory_gb: 96\n"), 29,
     "min_gpu_memory_gb: 96 GB is less than size_gb 134: the weights alone would not fit"),
    (SMALL.replace("    scheme: nvfp4_w4a4\n", "    scheme: nvfp4_w4a4\n    size_gb: 1\n"), 28,
     "checkpoints[1].size_gb: describes a hub or path checkpoint; a synthetic one is built here"),
])
def test_bad_size_fields_are_refused_where_they_stand(tmp_path, text, line, fragment):
    path = write(tmp_path, text)
    with pytest.raises(MatrixError) as e:
        load(path)
    assert str(e.value).startswith(f"{path}:{line}:"), str(e.value)
    assert fragment in str(e.value)


def test_runner_docs_list_every_real_checkpoint_with_its_size(real):
    """docs/runners.md's disk table is what a runner admin provisions from: one row per checkpoint, its size."""
    rows = {line.split("`")[1]: line for line in (ROOT / "docs" / "runners.md").read_text().splitlines()
            if line.startswith("| `") and "/" in line.split("|")[1]}  # the disk table, not the labels
    assert set(rows) == {c.id for c in real.checkpoints}
    for c in real.checkpoints:
        assert c.source.value[0] in rows[c.id]
        assert (f"| {c.size_gb:g} GB |" if c.size_gb else "| unknown |") in rows[c.id]
        assert (f"| {c.min_gpu_memory_gb:g} GB" if c.min_gpu_memory_gb else "| unknown") in rows[c.id]


def test_engine_args_layer_platform_arch_checkpoint_mode_and_gpus_set_tensor_parallel(real):
    """What an engine start of a real cell gets: the platform's memory share, lowered on GB10 (its unified
    memory), tensor_parallel_size from a multi-GPU checkpoint's `gpus`, and the mode's own arguments last."""
    from quantmatrix.engine.runner import engine_args

    glm = next(c for c in real.cells() if c.checkpoint.gpus > 1 and c.arch.name == "sm121" and c.mode.name == "eager")
    args = engine_args(real.e2e, glm, "cuda")
    assert args["gpu_memory_utilization"] == 0.6 and args["tensor_parallel_size"] == glm.checkpoint.gpus == 2
    assert args["enforce_eager"] is True
    one = next(c for c in real.cells() if c.checkpoint.gpus == 1 and c.arch.name == "sm120")
    assert "tensor_parallel_size" not in engine_args(real.e2e, one, "cuda")
    assert engine_args(real.e2e, one, "cuda")["gpu_memory_utilization"] == 0.85


def test_a_multi_gpu_checkpoint_skips_its_engine_checks_on_a_one_gpu_host_declared(pytester):
    """On a runner that declares one GB10 (--arch), a checkpoint with `gpus: 2` skips its engine check, naming
    both counts; its config-level check and the one-GPU checkpoint's engine check run."""
    (pytester.path / "ck").mkdir()
    pytester.makefile(".yaml", m=GPUS_MATRIX)
    pytester.makepyfile("def test_serves(case):\n    pass\n\n\ndef test_reads_config(case):\n    pass\n")
    result = pytester.runpytest("--matrix", "m.yaml", "--arch", "gb10", "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*big needs 2 GPUs of sm121 (GB10); this host has 1"])
