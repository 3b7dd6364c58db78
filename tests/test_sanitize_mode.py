"""The sanitize mode as data and as a user runs it: the `sanitizer:` knob validated with file:line, the default
matrix's mode on every arch, the cells skipped with the reason on a host without the arch or without
compute-sanitizer (failed under --strict-hardware), and the engine child's command line under the runner's
compute-sanitizer, shown by a stand-in executable (no GPU here, so no real compute-sanitizer can run)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from quantmatrix.adapter.versions import versions
from quantmatrix.cli import main
from quantmatrix.cli import matrix as matrix_cli
from quantmatrix.engine.protocol import CHILD_MODULE
from quantmatrix.errors import MatrixError
from quantmatrix.host import detect, sanitizer
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
LOG = ROOT / "tests" / "data" / "initcheck" / "initcheck-map-caching-h200.txt"

MATRIX = """\
version: 1
archs:
  - {name: sm121, capability: "12.1", aliases: [gb10], label: GB10}
modes:
  - {name: default, label: plain}
  - name: sanitize
    env: {PYTORCH_NO_CUDA_MEMORY_CACHING: "1"}
    engine_args: {enforce_eager: true}
    sanitizer: {tool: initcheck, flags: [--target-processes, all], prompts: 1, max_tokens: 2, silence: []}
    label: sanitized
schemes:
  - {name: bf16, marker: bf16, label: bf16}
checks:
  - {name: uninit_reads, kind: e2e, tier: gpu, vllm: [engine], cells: [{mode: sanitize}], description: d}
checkpoints:
  - {id: tiny, source: {path: ck}, producer: none, scheme: bf16}
e2e:
  prompts: prompts.txt
  references: refs
  max_tokens: 4
  logprobs: 2
  timeout_s: 60
  reference_mode: default
"""
KNOB = "sanitizer: {tool: initcheck, flags: [--target-processes, all], prompts: 1, max_tokens: 2, silence: []}"
TESTS = """\
from quantmatrix.checks import sanitize

def test_uninit_reads(case, engine_run, sanitized_run, judge):
    judge(sanitize.uninit_reads, case, engine_run, sanitized_run)
"""


def _matrix(tmp_path: Path, knob: str = KNOB) -> Path:
    (tmp_path / "prompts.txt").write_text("one prompt\nanother prompt\n")
    (tmp_path / "ck").mkdir(exist_ok=True)
    (tmp_path / "ck" / "config.json").write_text("{}")
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX.replace(KNOB, knob))
    return path


def test_the_default_matrix_s_sanitize_mode_is_a_named_knob():
    """Eager, no caching allocator, initcheck on every process with every report printed, 1 prompt x 2 tokens;
    the child's environment gets nothing from the knob but what the mode lists."""
    mode = load(ROOT / "matrices" / "default.yaml").mode("sanitize")
    knob = mode.sanitizer
    assert (knob.tool, knob.flags, knob.prompts, knob.max_tokens, knob.timeout_s, knob.silence) == (
        "initcheck", ("--target-processes", "all", "--print-limit", "10000000"), 1, 2, 1800.0, ())
    assert dict(mode.env) == {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"} and mode.engine_args["enforce_eager"] is True


@pytest.mark.parametrize(("knob", "line", "fragment"), [
    ("sanitizer: {tool: initcheck, flags: [--injection-path, /x], prompts: 1, max_tokens: 2}", 9,
     "'--injection-path' is not a flag a mode may pass"),
    ("sanitizer: {tool: initcheck, flags: [--log-file, x.log], prompts: 1, max_tokens: 2}", 9,
     "the runner sets --tool and --log-file"),
    ("sanitizer: {tool: initcheck, flags: [--print-limit], prompts: 1, max_tokens: 2}", 9,
     "--print-limit needs a value"),
    ("sanitizer: {tool: initcheck, flags: [--print-limit, --show-backtrace, 'no'], prompts: 1, max_tokens: 2}", 9,
     "--print-limit needs a value, got the flag '--show-backtrace'"),
    ("sanitizer: {tool: memcheck, prompts: 1, max_tokens: 2}", 9, "expected one of initcheck; got 'memcheck'"),
    ("sanitizer: {tool: initcheck, prompts: 0, max_tokens: 2}", 9, "prompts: expected an integer >= 1"),
    ("sanitizer: {tool: initcheck, prompts: 3, max_tokens: 2}", 6, "sanitizer.prompts 3 exceeds the 2 prompts"),
    ("sanitizer: {tool: initcheck, prompts: 1, max_tokens: 2, silence: [{kernel: '*silu*', reason: r}]}", 9,
     "missing required key 'link'"),
    ("sanitizer: {tool: initcheck, prompt: 1, max_tokens: 2}", 9, "unknown key 'prompt' (did you mean 'prompts'?)"),
])
def test_a_bad_knob_is_refused_with_file_and_line(tmp_path, knob, line, fragment):
    with pytest.raises(MatrixError) as e:
        load(_matrix(tmp_path, knob))
    assert f"m.yaml:{line}:" in str(e.value) and fragment in str(e.value)


def test_quantmatrix_list_shows_the_sanitize_cells_on_every_arch(capsys):
    """Every e2e checkpoint's GPU twin, on each of the four archs, has its uninit_reads case."""
    assert main(["list", "--matrix", str(ROOT / "matrices" / "default.yaml")]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if "uninit_reads" in line]
    cells = {r[0] for r in rows}
    assert cells == {f"{ck}@{arch}-sanitize" for ck in ("qwen3moe-tiny-bf16", "qwen3moe-tiny-nvfp4-weight-only",
                                                         "qwen3moe-tiny-nvfp4-w4a4", "qwen3moe-tiny-ct-nvfp4a16",
                                                         "mixtral-tiny-nvfp4-weight-only",
                                                         "qwen3moe-tiny-ct-w4a16-g32", "qwen3moe-tiny-gptq-w4a16-g32",
                                                         "qwen3moe-tiny-mo-fp8", "qwen3moe-tiny-ct-fp8-dynamic",
                                                         "qwen3moe-tiny-hf-fp8-block", "qwen3moe-tiny-ct-w8a8-int8")
                     for arch in ("sm90", "sm100", "sm120", "sm121")}
    assert all(r[-1] == "uninit_reads(gpu)" or "uninit_reads(gpu)" in r for r in rows)


# ------------------------------------------------------------------------------------- through pytester


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One quantmatrix cache for this module's inner runs: the vLLM health check (an engine check needs it) runs
    once, not once per run."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, shared_cache: Path) -> pytest.Pytester:
    """The matrix above on a host with no GPU and no compute-sanitizer (CUDA faked away, PATH without it)."""
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(shared_cache))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SRC), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]))
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv(detect.ARCH_ENV, raising=False)
    monkeypatch.setattr(detect, "query_nvidia_smi", lambda: None)
    monkeypatch.setattr(detect, "query_torch", lambda: ([], "faked: no CUDA"))
    _matrix(pytester.path)
    pytester.makepyfile(test_e2e=TESTS)
    return pytester


def test_on_a_host_without_the_arch_the_cell_skips_naming_it(project):
    result = project.runpytest("--matrix", "m.yaml", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*needs sm121 (GB10); this host: no CUDA device*"])


def test_without_compute_sanitizer_the_mode_skips_and_a_strict_runner_fails(project):
    """The arch present (declared) but no compute-sanitizer anywhere it is looked for: skipped with where it was
    looked for; under --strict-hardware a failure; a --compute-sanitizer that is not an executable is a usage
    error naming the flag."""
    if sanitizer.find() is not None:
        pytest.skip(f"this host has {sanitizer.find()} where the runner looks for it")
    why = "mode sanitize runs the engine under compute-sanitizer (initcheck); no compute-sanitizer on PATH, in " \
          "$CUDA_HOME/bin or /usr/local/cuda/bin*--compute-sanitizer PATH*"
    result = project.runpytest("--matrix", "m.yaml", "--arch", "sm121", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"*SKIPPED*{why}"])
    result = project.runpytest("--matrix", "m.yaml", "--arch", "sm121", "--strict-hardware")
    result.assert_outcomes(errors=1)  # failed in setup, as every --strict-hardware gate fails
    result.stdout.fnmatch_lines([f"*--strict-hardware: {why}"])
    result = project.runpytest("--matrix", "m.yaml", "--compute-sanitizer", "nowhere/compute-sanitizer")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--compute-sanitizer needs the path of an executable file*'nowhere/*"])


STAND_IN = """\
#!{python}
# Stands in for compute-sanitizer (there is no GPU here): records how it was called, writes the real H200 report
# where --log-file says, and exits without running the engine child.
import json, os, shutil, sys
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
shutil.copy({log!r}, log.replace("%p", str(os.getpid())))
with open({record!r}, "w") as f:
    json.dump({{"argv": args, "env": {{k: os.environ.get(k) for k in ("PYTORCH_NO_CUDA_MEMORY_CACHING",
                                                                     "QUANTMATRIX_RECORD_PARAMS")}}}}, f)
sys.exit(1)
"""


def test_the_engine_child_runs_under_the_runner_s_compute_sanitizer(project):
    """A stand-in compute-sanitizer (mocked: no GPU here) shows the command line: --tool from the knob, the
    mode's flags, one log per process in the run's directory, then the engine child; the child's environment has
    the mode's allocator setting and the parameter record switched on; the request generates 1 prompt x 2 tokens.
    The child never ran, so the case fails as a failed sanitized run (with the log the stand-in wrote)."""
    fake, record = project.path / "compute-sanitizer", project.path / "called.json"
    fake.write_text(STAND_IN.format(python=sys.executable, log=str(LOG), record=str(record)))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    result = project.runpytest("--matrix", "m.yaml", "--arch", "sm121", "--compute-sanitizer", str(fake))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*tiny@sm121-sanitize uninit_reads: the sanitized engine run failed: the child "
                                 "exited with status 1 without a result*"])
    called = json.loads(record.read_text())
    run_dir = Path(called["argv"][5]).parent
    assert called["argv"] == ["--tool", "initcheck", "--target-processes", "all", "--log-file",
                              str(run_dir / "sanitizer.%p.log"), sys.executable, "-m", CHILD_MODULE,
                              str(run_dir / "request.json"), str(run_dir / "result.json")]
    assert called["env"] == {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "QUANTMATRIX_RECORD_PARAMS": "1"}
    request = json.loads((run_dir / "request.json").read_text())
    assert (request["prompts"], request["greedy_prompts"], request["max_tokens"]) == (["one prompt"], 1, 2)
    assert request["engine_args"]["enforce_eager"] is True
    assert request["sanitizer"] == {"tool": "initcheck", "argv": [str(fake), "--tool", "initcheck",
                                                                  "--target-processes", "all"]}
    assert len(list(run_dir.glob("sanitizer.*.log"))) == 1


def test_the_runner_looks_where_the_cuda_toolkit_installs_it(tmp_path, monkeypatch):
    """PATH first, then $CUDA_HOME/bin; a given path that is not executable is none, and says so."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    exe = tmp_path / "cuda" / "bin" / "compute-sanitizer"
    exe.write_text("#!/bin/sh\n")
    if sanitizer.find() is not None and sanitizer.find() != exe:
        pytest.skip(f"this host has {sanitizer.find()} where the runner looks for it")
    assert sanitizer.find() is None
    exe.chmod(0o755)
    assert sanitizer.find() == exe
    (tmp_path / "empty").mkdir()
    on_path = tmp_path / "empty" / "compute-sanitizer"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    assert sanitizer.find() == on_path
    assert sanitizer.find(tmp_path / "nope") is None
    assert sanitizer.missing(tmp_path / "nope") == f"--compute-sanitizer {tmp_path / 'nope'} is not an executable file"


def test_detect_says_whether_this_host_can_run_the_sanitized_modes(tmp_path, capsys, monkeypatch):
    """`quantmatrix detect` names the compute-sanitizer the runner would use, or that the mode will be skipped. The
    host is one without vLLM and without a GPU (faked: it keeps detect off the vLLM import, which
    tests/test_cli.py and tests/test_vllm_health.py run; a GPU host without vLLM is tests/test_no_vllm_host.py's)."""
    real = versions()
    monkeypatch.setattr(matrix_cli, "versions", lambda: {**real, "vllm_distribution": "none"})
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` finds nothing, as when absent
    monkeypatch.setattr(detect, "query_nvidia_smi", lambda: None)
    monkeypatch.setattr(detect, "query_torch", lambda: ([], "faked"))
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    default = str(ROOT / "matrices" / "default.yaml")
    if sanitizer.find() is None:
        assert main(["detect", "--matrix", default]) == 0
        assert "compute-sanitizer: none (no compute-sanitizer on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin (it " \
               "ships with the CUDA toolkit; or pass --compute-sanitizer PATH)); mode(s) sanitize will be skipped" \
               in capsys.readouterr().out
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "compute-sanitizer"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert main(["detect", "--matrix", default]) == 0
    out = capsys.readouterr().out
    assert f"compute-sanitizer: {exe}\n" in out and "vllm_health: no vLLM installed" in out
