"""A small valid matrix for tests of quantmatrix itself, and a way to write variants of it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from quantmatrix.host import detect
from quantmatrix.schema.model import Case, Cell, Matrix

ROOT = Path(__file__).resolve().parents[1]
SMALL = """\
version: 1
archs:
  - {name: sm100, capability: "10.0", aliases: [b200], label: B200}
  - {name: sm120, capability: "12.0", aliases: [rtx_pro_6000], label: RTX PRO 6000}
  - {name: sm121, capability: "12.1", aliases: [gb10, dgx_spark], label: GB10 / DGX Spark}
modes:
  - {name: default, label: cudagraphs}
  - name: nocache
    env: {PYTORCH_NO_CUDA_MEMORY_CACHING: "1"}
    engine_args: {enforce_eager: true}
    label: no caching allocator
schemes:
  - {name: bf16, marker: bf16, label: bf16, factory: bf16, expect: {quant_method: none, resolves_to: unquantized}}
  - {name: nvfp4_weight_only, marker: weight_only, label: W4A16, factory: nvfp4_weight_only, expect: {resolves_to: weight_only}}
  - {name: nvfp4_w4a4, marker: w4a4, label: W4A4, factory: nvfp4_w4a4, expect: {resolves_to: w4a4}}
checks:
  - {name: cpu_probe, kind: dispatch, tier: cpu, description: runs anywhere}
  - {name: gpu_probe, kind: e2e, tier: gpu, schemes: [nvfp4_weight_only], description: needs the arch}
checkpoints:
  - id: tiny-wo
    source: {synthetic: {model: qwen3_moe}}
    producer: modelopt
    scheme: nvfp4_weight_only
  - id: tiny-w4a4
    source: {synthetic: {model: qwen3_moe}}
    producer: modelopt
    scheme: nvfp4_w4a4
"""  # noqa: E501  (one scheme entry per line keeps the line numbers the schema tests name)

# One GB10 arch, an engine check and a config-level one, and a checkpoint that needs two GPUs beside one that
# needs one: the GPU-count gate's matrix (test_real_matrix, test_runner_plugin).
GPUS_MATRIX = """\
version: 1
archs: [{name: sm121, capability: "12.1", aliases: [gb10], label: GB10}]
modes: [{name: default, label: d}]
schemes: [{name: bf16, marker: bf16, label: bf16}]
checks:
  - {name: serves, kind: e2e, tier: gpu, vllm: [engine], description: an engine start}
  - {name: reads_config, kind: lint, tier: gpu, description: one GPU is enough}
checkpoints:
  - {id: big, source: {path: ck}, producer: none, scheme: bf16, gpus: 2}
  - {id: small, source: {path: ck}, producer: none, scheme: bf16}
"""


def write(tmp: Path, text: str = SMALL, name: str = "m.yaml") -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def default_variant(tmp: Path, text: str, name: str = "m.yaml") -> Path:
    """A variant of matrices/default.yaml in a repository of its own under `tmp` (a matrix reads files only inside
    its repository): `.git`, and matrices/ with the prompts and tasks the default names."""
    (tmp / ".git").mkdir(exist_ok=True)
    for part in ("prompts", "tasks"):
        shutil.copytree(ROOT / "matrices" / part, tmp / "matrices" / part, dirs_exist_ok=True)
    return write(tmp / "matrices", text, name)


def case_for(matrix: Matrix, checkpoint_id: str, check: str, arch: str = "sm121", mode: str = "default") -> Case:
    """The matrix's case of `check` on one cell, as the plugin would parametrize it."""
    ck = next(c for c in matrix.checkpoints if c.id == checkpoint_id)
    return Case(matrix.checks[check], Cell(ck, matrix.arch(arch), matrix.mode(mode)), None)


def gpu_less_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, suite: str,
                   matrix: str = SMALL) -> pytest.Pytester:
    """A pytester suite over `matrix` on a host whose CUDA queries are faked to find no device (so any host
    agrees)."""
    monkeypatch.setattr(detect, "query_nvidia_smi", lambda: None)
    monkeypatch.setattr(detect, "query_torch", lambda: ([], "faked: no CUDA"))
    monkeypatch.delenv(detect.ARCH_ENV, raising=False)
    pytester.makefile(".yaml", m=matrix)
    pytester.makepyfile(test_suite=suite)
    return pytester
