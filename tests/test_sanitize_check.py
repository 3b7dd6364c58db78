"""uninit_reads, every branch, on the real H200 report and a record in the engine's own form; `quantmatrix initcheck`
on the same inputs (exit 1 findings, 0 none, 2 unreadable); and the report's per-cell section. The sanitized run
itself needs a GPU: here its directory is written as the runner leaves it (the logs, result.json)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest
from matrixkit import default_variant

from quantmatrix import properties as P
from quantmatrix.checks import sanitize
from quantmatrix.cli import main
from quantmatrix.engine.protocol import BUILT
from quantmatrix.engine.runner import Failure, GroupRun
from quantmatrix.measure import sanitized
from quantmatrix.report import render_md
from quantmatrix.report.build import build
from quantmatrix.report.model import grid
from quantmatrix.schema.load import load
from quantmatrix.schema.model import Case, Cell
from quantmatrix.schema.sanitizer import Silence

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "initcheck"
TEXT = (DATA / "initcheck-map-nocache-h200.txt").read_text(encoding="utf-8")
MATRIX = load(ROOT / "matrices" / "default.yaml")
PID = 41


def _case(mode: str = "sanitize", silence: tuple[Silence, ...] = ()) -> Case:
    ck = next(c for c in MATRIX.checkpoints if c.id == "qwen3moe-tiny-nvfp4-weight-only")
    m = MATRIX.mode(mode)
    if m.sanitizer is not None:
        m = dataclasses.replace(m, sanitizer=dataclasses.replace(m.sanitizer, silence=silence))
    return Case(MATRIX.checks["uninit_reads"], Cell(ck, MATRIX.arch("sm90"), m), None)


def _worker(shift: int = 0, requested: bool = True) -> dict:
    """The probe's PARAMS line in engine.params' form (one record, as built), optionally moved by `shift`."""
    printed = json.loads(next(x for x in TEXT.splitlines() if x.startswith("PARAMS "))[7:])
    tensors = [{"name": n, "kind": "parameter", "ptr": a + shift, "nbytes": b - a, "element_size": s, "shape": sh,
                "stride": None, "dtype": "float32" if s == 4 else "uint8", "experts": sh[0]}
               for n, (a, b, s, sh) in printed.items()]
    records = [{"stage": BUILT, "model": 0, "tensors": tensors, "marker": None}] if requested else []
    params = {"requested": requested, "registered_by": "engine_child", "records": records, "pid": PID}
    return {"pid": PID, "moe_layers": {}, "poison": {"requested": None}, "params": params}


def _run(tmp_path: Path, log: str | None = TEXT, worker: dict | None = None, failure: Failure | None = None
         ) -> GroupRun:
    """A sanitized run's directory as the runner leaves it."""
    d = tmp_path / "run"
    d.mkdir(parents=True, exist_ok=True)
    if log is not None:
        (d / f"sanitizer.{PID}.log").write_text(log)
    result = {"status": "ok", "outputs": [], "timings": {"import_s": 1.0, "load_s": 2.0, "generate_s": 0.5},
              "versions": {P.VLLM_VERSION: "0.32.0", P.TORCH_VERSION: "2.11.0"}, "device": {"name": "NVIDIA H200"},
              "workers": [worker or _worker()]}
    (d / "result.json").write_text(json.dumps(result))
    return GroupRun(_case().cell.id, d, {"greedy_prompts": 1, "poison": None}, None if failure else result,
                    failure, 9.0)


def _verdict(case: Case, run: GroupRun):
    measured = sanitized.of_run(run.sanitizer_logs(), run.workers()) if run.result else None
    return sanitize.uninit_reads(case, run, measured)


def test_the_probe_s_unwritten_tensors_fail_the_cell_by_layer_tensor_experts_and_kernel(tmp_path):
    run = _run(tmp_path)
    v = _verdict(_case(), run)
    lines = v.message.splitlines()
    assert lines[0] == (
        "qwen3moe-tiny-nvfp4-weight-only@sm90-sanitize uninit_reads: 2 tensor(s) of the model read where nobody "
        "wrote: model.layers.0.mlp.experts.w2_input_scale (expert 5, 1 read, vectorized_elementwise_kernel<4, "
        "BinaryFunctor<float, float…); model.layers.1.mlp.experts.w13_input_scale (experts 0-7, rows 0-1, 16 reads, "
        "reduce_kernel<512, 1, ReduceOp<float, MaxOps<float>, unsign…)")
    assert lines[1] == "[no MoE layer seen] compute-sanitizer initcheck, 17 reports:"
    assert lines[3] == (
        "- model.layers.1.mlp.experts.w13_input_scale (layer model.layers.1.mlp.experts, tensor w13_input_scale: "
        "parameter float32 [8, 2], as built, before process_weights_after_loading): 16 reads of 16/16 elements; "
        "experts 0-7, rows 0-1; kernel: reduce_kernel<512, 1, ReduceOp<float, MaxOps<float>, unsigned int, float, "
        "4, 4>> x16 launched from <module> in probe_map.py:28")
    assert lines[-2:] == ["other uninitialised reads (scratch/activation memory, not failed): none",
                          f"reproduce by hand: quantmatrix initcheck {run.directory}"]
    props = dict(v.properties)
    found = json.loads(props[P.UNINIT_PARAM_READS])
    assert [(f["tensor"], f["reads"], f["elements"], f["experts"]) for f in found] == [
        ("model.layers.0.mlp.experts.w2_input_scale", 1, 1, "5"),
        ("model.layers.1.mlp.experts.w13_input_scale", 16, 16, "0-7")]
    assert (props[P.SANITIZER_REPORTS], props[P.UNINIT_ORDER], props[P.UNINIT_OTHER_READS]) == ("17", "unknown", "{}")
    assert props[P.UNINIT_ATTRIBUTION] == sanitized.BY_PID


def test_a_log_named_by_the_sanitizer_s_own_pid_still_names_the_tensors_and_says_how(tmp_path, capsys):
    """compute-sanitizer's %p may be its own pid: the one log, named by no worker, goes with the one worker that
    held the model; the failure and the property say so."""
    run = _run(tmp_path)
    (run.directory / f"sanitizer.{PID}.log").rename(run.directory / "sanitizer.9999.log")
    v = _verdict(_case(), run)
    lines = v.message.splitlines()
    assert "2 tensor(s) of the model read where nobody wrote" in lines[0]
    said = ("sanitizer.9999.log is named by no worker's pid (compute-sanitizer's own: one log for every process it "
            f"followed), mapped through the one worker that held the model, pid {PID}")
    assert lines[1] == f"[no MoE layer seen] compute-sanitizer initcheck, 17 reports (logs: {said}):"
    assert dict(v.properties)[P.UNINIT_ATTRIBUTION] == said
    assert main(["initcheck", str(run.directory)]) == 1
    assert f"logs: {said}" in capsys.readouterr().out.splitlines()


def test_a_silenced_kernel_is_recorded_apart_and_fails_nothing(tmp_path):
    """The matrix's silence entry (kernel glob, reason, link) takes the max-reduce's reads out of the verdict but
    not out of the record; silencing both kernels leaves the cell green with both named."""
    entry = Silence("*MaxOps*", "*.w13_input_scale", "the fold reads padding", "https://x/1", "m.yaml:1:1")
    v = _verdict(_case(silence=(entry,)), _run(tmp_path))
    assert v.outcome == "fail" and "w13_input_scale" not in v.message.splitlines()[0]
    assert json.loads(dict(v.properties)[P.UNINIT_SILENCED]) == [
        {"tensor": "model.layers.1.mlp.experts.w13_input_scale", "kernel": "reduce_kernel<512, 1, ReduceOp<float, "
         "MaxOps<float>, unsigned int, float, 4, 4>>", "reads": 16, "reason": "the fold reads padding",
         "link": "https://x/1"}]
    everything = Silence("*", "*", "r", "l", "m.yaml:2:1")
    v = _verdict(_case(silence=(everything,)), _run(tmp_path))
    assert v.outcome == "ok" and len(json.loads(dict(v.properties)[P.UNINIT_SILENCED])) == 2


def test_reads_outside_every_tensor_are_counted_per_kernel_never_failed(tmp_path):
    v = _verdict(_case(), _run(tmp_path, worker=_worker(shift=1 << 20)))
    assert v.outcome == "ok"
    other = json.loads(dict(v.properties)[P.UNINIT_OTHER_READS])
    assert sorted(other.values()) == [1, 16] and dict(v.properties)[P.UNINIT_PARAM_READS] == "[]"


@pytest.mark.parametrize(("arrange", "says"), [
    (lambda t: (_case("nocache"), _run(t)), "mode nocache has no `sanitizer:` knob"),
    (lambda t: (_case(), _run(t, failure=Failure("timeout: no result after 1800 s", "killed", t / "engine.log", ""))),
     "the sanitized engine run failed: timeout: no result after 1800 s"),
    (lambda t: (_case(), _run(t, worker=_worker(requested=False))),
     "no engine worker recorded the model's parameters (pid 41: registered_by=engine_child, requested=False"),
    (lambda t: (_case(), _run(t, log=None)), "compute-sanitizer wrote no log (sanitizer.%p.log)"),
    (lambda t: (_case(), _run(t, log="\n".join(TEXT.splitlines()[:40]))), "the log ends inside this report"),
    (lambda t: (_case(), _run(t, log=TEXT.replace("ERROR SUMMARY: 17 errors", "ERROR SUMMARY: 117 errors\n"
                                                  "========= ERROR SUMMARY: 100 errors were not printed"))),
     "compute-sanitizer withheld 100 of 117 reports (--print-limit), which may be reads of the model's tensors"),
    (lambda t: (_case(), _run(t, worker=_worker(shift=1 << 20), log=TEXT.replace(
        "ERROR SUMMARY: 17 errors", "ERROR SUMMARY: 18 errors\n========= ERROR SUMMARY: 1 errors were not printed"))),
     "uninit_reads: compute-sanitizer withheld 1 of 18 reports (--print-limit)"),
])
def test_a_run_that_proves_nothing_fails_saying_why(tmp_path, arrange, says):
    case, run = arrange(tmp_path)
    v = _verdict(case, run)
    assert v.outcome == "fail" and says in v.message, v.message


# ------------------------------------------------------------------------------------------ the CLI


def test_the_cli_names_the_findings_of_a_saved_log(tmp_path, capsys):
    """The probe's log with its own PARAMS line: exit 1 and the same words as the cell; its run directory too;
    --json carries the properties; a mode's silence entries apply with --mode."""
    assert main(["initcheck", str(DATA / "initcheck-map-caching-h200.txt")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("17 reports, 10 tensors recorded; order: unknown (no marker read: every record applies "
                           "throughout)")
    assert out[1].startswith("FAIL 2 tensor(s) of the model read where nobody wrote: "
                             "model.layers.0.mlp.experts.w2_input_scale (expert 5, 1 read,")
    assert out[3].startswith("- model.layers.1.mlp.experts.w13_input_scale (layer model.layers.1.mlp.experts,")
    run = _run(tmp_path)
    assert main(["initcheck", str(run.directory), "--mode", "sanitize"]) == 1
    assert "experts 0-7, rows 0-1" in capsys.readouterr().out
    assert main(["initcheck", str(run.directory / f"sanitizer.{PID}.log"), "--params",
                 str(run.directory / "result.json"), "--json"]) == 1
    assert [f["tensor"] for f in json.loads(capsys.readouterr().out)[P.UNINIT_PARAM_READS]] == [
        "model.layers.0.mlp.experts.w2_input_scale", "model.layers.1.mlp.experts.w13_input_scale"]
    matrix = default_variant(tmp_path, (ROOT / "matrices" / "default.yaml").read_text().replace(
        "      silence: []", "      silence: [{kernel: '*', reason: known, link: 'https://x/2'}]"))
    assert main(["initcheck", str(run.directory), "--mode", "sanitize", "--matrix", str(matrix)]) == 0
    out = capsys.readouterr().out
    assert "OK no tensor of the model was read where nobody wrote" in out
    assert out.count("silenced (known; https://x/2): ") == 2


@pytest.mark.parametrize(("args", "says"), [
    (["initcheck", str(DATA / "initcheck-h200.txt")], "initcheck-h200.txt:2: a backtrace frame outside any report"),
    (["initcheck", "nowhere.log"], "nowhere.log: no such file or directory"),
    (["initcheck", str(DATA / "initcheck-map-caching-h200.txt"), "--mode", "nocache"],
     "--mode nocache: "),
    (["initcheck", str(DATA), "--params", "x.json"], "--params goes with one log"),
    (["initcheck", str(DATA)], "result.json: not a readable JSON file"),
])
def test_the_cli_exits_2_on_input_it_cannot_read_whole(capsys, args, says):
    assert main(args) == 2
    assert says in capsys.readouterr().err


def test_the_cli_needs_a_record(tmp_path, capsys):
    log = tmp_path / "a.log"
    log.write_text("\n".join(x for x in TEXT.splitlines() if not x.startswith("PARAMS")))
    assert main(["initcheck", str(log)]) == 2
    assert "no parameter record: the log has no `PARAMS {json}` line" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ the report


def test_the_night_s_report_shows_each_sanitized_cell(tmp_path):
    """A failed sanitized cell and a green one, as JUnit: matrix.md lists both with their findings and the
    counted scratch reads."""
    v_fail = _verdict(_case(), _run(tmp_path / "a"))
    v_ok = _verdict(_case(), _run(tmp_path / "b", worker=_worker(shift=1 << 20)))

    def testcase(arch: str, verdict) -> str:
        cell = f"qwen3moe-tiny-nvfp4-weight-only@{arch}-sanitize"
        props = [(P.CHECKPOINT, "qwen3moe-tiny-nvfp4-weight-only"), (P.ARCH, arch), (P.MODE, "sanitize"),
                 (P.CHECK, "uninit_reads"), (P.CELL, cell), *verdict.properties]
        xml = "".join(f'<property name="{k}" value={quoteattr(str(v))}/>' for k, v in props)
        result = '<failure message="m"/>' if verdict.outcome == "fail" else ""
        return (f'<testcase classname="suites.test_e2e" name="test_uninit_reads[{cell}]" time="1">'
                f"<properties>{xml}</properties>{result}</testcase>")

    junit = tmp_path / "junit.xml"
    junit.write_text(f'<testsuites><testsuite name="s">{testcase("sm90", v_fail)}{testcase("sm120", v_ok)}'
                     "</testsuite></testsuites>")
    import datetime

    report = build([str(junit)], None, night="n1", date=datetime.date(2026, 12, 5))
    md = render_md.render(report, grid(report))
    section = md[md.index("## Uninitialised reads (sanitize mode) (2)"):].splitlines()
    assert section[2].startswith("- `suites.test_e2e::test_uninit_reads[qwen3moe-tiny-nvfp4-weight-only@sm120-"
                                 "sanitize]` **passed**: 0 tensor(s) of the model read where nobody wrote; 17 other "
                                 "reads (scratch/activation) in 2 kernel(s): ")
    assert section[3].startswith("- `suites.test_e2e::test_uninit_reads[qwen3moe-tiny-nvfp4-weight-only@sm90-"
                                 "sanitize]` **failed**: 2 tensor(s) of the model read where nobody wrote: "
                                 r"model.layers.0.mlp.experts.w2\_input\_scale (experts 5, reads: 1), "
                                 r"model.layers.1.mlp.experts.w13\_input\_scale (experts 0-7, reads: 16); 0 other "
                                 "reads (scratch/activation) in 0 kernel(s)")
