"""compute-sanitizer initcheck's report read and mapped, against the real H200 outputs (tests/data/initcheck): the
probe's 17 reads are exactly its two unwritten tensors, a shifted address changes the finding, a cut or garbled log
is a clear error (never a crash, never a partial answer), and a 100,000-line report reads in well under a second."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantmatrix.engine.protocol import BUILT, PROCESSED
from quantmatrix.errors import SanitizerLogError
from quantmatrix.measure import initcheck, sanitized, uninit

DATA = Path(__file__).resolve().parent / "data" / "initcheck"
MAPS = ["initcheck-map-nocache-h200.txt", "initcheck-map-caching-h200.txt"]
TEXT = (DATA / MAPS[1]).read_text(encoding="utf-8")
LINES = TEXT.splitlines()
MUL = "void at::native::vectorized_elementwise_kernel<(int)4, at::native::BinaryFunctor<float, float, float, " \
      "at::native::binary_internal::MulFunctor<float>>, std::array<char *, (unsigned long)3>>(int, T2, T3)"
MAX = "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::MaxOps<float>, " \
      "unsigned int, float, (int)4, (int)4>>(T3)"


def _findings(text: str) -> tuple[list[uninit.Finding], dict[str, int]]:
    log = initcheck.parse(text, "log")
    record = uninit.Record(tuple(uninit.from_params_line(log.params[0], "PARAMS")), None)
    mapped = uninit.map_reports(log, record)
    return uninit.findings(mapped.hits), mapped.other


@pytest.mark.parametrize("name", MAPS)
def test_the_probe_s_reads_are_exactly_its_two_unwritten_tensors(name):
    """Both allocators: 16 reads of all 16 elements of layer 1's w13_input_scale (experts 0-7, both halves) by the
    max-reduce of the alphas fold, and 1 read of expert 5 of layer 0's w2_input_scale by the multiply; no other
    read, and nothing in scratch memory."""
    found, other = _findings((DATA / name).read_text(encoding="utf-8"))
    assert [(f.tensor.name, f.reads, sorted(f.elements), f.experts, f.rows, [(h.kernel, h.reads) for h in f.hits])
            for f in found] == [
        ("model.layers.0.mlp.experts.w2_input_scale", 1, [5], [5], [], [(MUL, 1)]),
        ("model.layers.1.mlp.experts.w13_input_scale", 16, list(range(16)), list(range(8)), [0, 1], [(MAX, 16)])]
    assert other == {}
    assert [h.launched_from for f in found for h in f.hits] == ["<module> in probe_map.py:29",
                                                                "<module> in probe_map.py:28"]


def test_each_report_is_read_whole():
    log = initcheck.parse(TEXT, "caching")
    assert (len(log.reports), log.errors, log.not_printed, len(log.params), log.unknown) == (17, 17, 0, 1, ())
    first = log.reports[0]
    assert (first.line, first.what, first.size, first.kernel, first.thread, first.block, first.address) == (
        3, "Uninitialized __global__ memory read", 4, MUL, (5, 0, 0), (0, 0, 0), 0x7f2fc6840614)
    assert first.frames[:2] == ("[0x1376c] in libcudart.so.13", "cudaLaunchKernel [0x745b7] in libcudart.so.13")
    assert first.frames[-1] == "<module> in probe_map.py:29" and len(first.frames) == 4  # 3 native + Python's
    assert initcheck.short_kernel(MAX) == "reduce_kernel<512, 1, ReduceOp<float, MaxOps<float>, unsigned int, " \
                                          "float, 4, 4>>"


def _shift(text: str, address: int, by: int) -> str:
    old = f"Address {address:#x}"
    assert text.count(old) == 1
    return text.replace(old, f"Address {address + by:#x}")


def test_an_address_shifted_out_of_the_tensor_changes_the_finding():
    """w2_input_scale is 8 floats: the read of expert 5 moved 32 bytes on lands past its end, in no recorded tensor,
    so that finding goes and the multiply counts one scratch read; moved 4 bytes, it names expert 6."""
    found, other = _findings(_shift(TEXT, 0x7f2fc6840614, 32))
    assert [f.tensor.name for f in found] == ["model.layers.1.mlp.experts.w13_input_scale"]
    assert other == {MUL: 1}
    found, _ = _findings(_shift(TEXT, 0x7f2fc6840614, 4))
    assert (found[0].tensor.leaf, found[0].experts, sorted(found[0].elements)) == ("w2_input_scale", [6], [6])


def _cut(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("text", "says"), [
    pytest.param(_cut(LINES[:40]), r"caching:37: the log ends inside this report", id="cut-inside-a-report"),
    pytest.param(_cut(LINES[:533]), r"no ERROR SUMMARY line \(17 reports read\)", id="cut-before-the-summary"),
    pytest.param((DATA / "initcheck-h200.txt").read_text(), r"caching:2: a backtrace frame outside any report",
                 id="cut-at-the-head (real)"),
    pytest.param(TEXT.replace("=========     Address 0x7f2fc6880a08\n", ""), r"caching:99: the report has no "
                 r"address line", id="no-address"),
    pytest.param(_cut(LINES[:2] + LINES[36:]), r"counts 17 errors \(0 not printed\), but the log holds 16 reports: "
                 r"reports are missing", id="a-report-gone"),
    pytest.param(TEXT.replace("ERROR SUMMARY: 17", "Program hit an error\n========= ERROR SUMMARY: 18"),
                 r"holds 17 reports: lines this reader does not know: line \d+: 'Program hit an error'",
                 id="an-error-of-unknown-form"),
    pytest.param(TEXT.replace('PARAMS {"model', 'PARAMS {model'), r"caching:2: the PARAMS line is not JSON",
                 id="params-not-json"),
])
def test_a_cut_or_garbled_log_is_a_clear_error(text, says):
    with pytest.raises(SanitizerLogError, match=says):
        initcheck.parse(text, "caching")


def test_every_cut_of_the_real_log_reads_or_says_why():
    """Cut after any line: a SanitizerLogError naming the log, never another exception, never a partial answer
    (only the whole log, and the cut after its summary, read)."""
    read = []
    for n in range(len(LINES) + 1):
        try:
            log = initcheck.parse(_cut(LINES[:n]), "caching")
        except SanitizerLogError as e:
            assert str(e).startswith("caching")
        else:
            read.append((n, len(log.reports)))
    assert read == [(534, 17), (535, 17)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(LINES) - 1), st.sampled_from(["drop", "dup", "garble", "swap"])),
                min_size=1, max_size=4))
def test_a_mutated_log_never_crashes_the_reader(edits):
    lines = list(LINES)
    for at, how in edits:
        at = min(at, len(lines) - 1)
        if how == "drop":
            del lines[at]
        elif how == "dup":
            lines.insert(at, lines[at])
        elif how == "garble":
            lines[at] = lines[at][: len(lines[at]) // 2]
        else:
            lines[at], lines[-1 - at] = lines[-1 - at], lines[at]
    try:
        initcheck.parse(_cut(lines), "m")
    except SanitizerLogError:
        pass


@pytest.mark.parametrize("block", [
    pytest.param(LINES[2:36], id="backtraces"),  # the whole first report: header, 4 lines, 28 frames, closing line
    pytest.param(LINES[2:7] + LINES[35:36], id="no-backtraces"),  # as `--show-backtrace no` prints it
])
def test_a_100000_line_report_reads_every_report(block):
    """The real first report repeated to 100,000 lines (2,942 reports with their frames, or 16,667 without), read in
    one pass. How long that takes is bench/bench_sanitize.py's to measure (a timed test fails on a loaded machine)."""
    copies = -(-100_000 // len(block))
    text = _cut([LINES[0], *block * copies, f"========= ERROR SUMMARY: {copies} errors"])
    assert len(text.splitlines()) >= 100_000
    log = initcheck.parse(text, "big")
    assert len(log.reports) == copies


# ------------------------------------------------------------------------------------------ the mapping


def _tensor(name: str, ptr: int, shape: tuple[int, ...], size: int = 4, stage: str = PROCESSED,
            stride: tuple[int, ...] | None = None, experts: int | None = None) -> uninit.Tensor:
    stride = stride or uninit.contiguous(shape)
    span = (sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) + 1) * size
    return uninit.Tensor(name, "parameter", ptr, span, size, shape, stride, "float32", experts, stage)


def _report(address: int, kernel: str = "k", size: int = 4) -> initcheck.Report:
    return initcheck.Report(1, "Uninitialized __global__ memory read", size, kernel, (0, 0, 0), (0, 0, 0), address,
                            ())


def _log(*reports: initcheck.Report) -> initcheck.SanitizerLog:
    return initcheck.SanitizerLog("log", reports, len(reports), 0, (), ())


def test_the_marker_splits_the_report_between_the_two_records():
    """Before the marker's read both records apply, the built one first (the seed's fold reads its input_scale);
    after it only the processed record: a freed built tensor's address reused later is scratch, not the tensor.
    The marker's own reads are never counted."""
    built = _tensor("m.layers.0.mlp.experts.w13_input_scale", 0x1000, (8, 2), stage=BUILT, experts=8)
    kept = _tensor("m.layers.0.mlp.experts.w13_weight", 0x2000, (8, 4), stage=PROCESSED, experts=8)
    record = uninit.Record((built, kept), marker=(0x9000, 16))
    log = _log(_report(0x1004, "fold"), _report(0x2010, "gemm"), _report(0x9000, "marker"), _report(0x9004, "marker"),
               _report(0x1004, "silu"), _report(0x2010, "gemm"))
    mapped = uninit.map_reports(log, record)
    assert mapped.marker_at == 2
    assert sorted((h.tensor.leaf, h.kernel, h.reads, sorted(h.elements)) for h in mapped.hits) == [
        ("w13_input_scale", "fold", 1, [1]), ("w13_weight", "gemm", 2, [4])]
    assert mapped.other == {"silu": 1}
    unordered = uninit.map_reports(log, uninit.Record((built, kept), marker=(0xA000, 16)))
    assert unordered.marker_at is None and unordered.other == {"marker": 2}
    assert {h.kernel: h.reads for h in unordered.hits} == {"fold": 1, "gemm": 2, "silu": 1}


def test_ranges_overlap_tie_and_stride():
    """Tied weights (one range, two names) are one entry under the first name; a tensor inside another's range is
    found with it; a strided view's gap is not its element; a 4-byte read of bytes touches 4 elements."""
    outer = _tensor("a.weight", 0x100, (4, 4))
    inner = _tensor("a.view", 0x110, (4,))
    tied = _tensor("b.tied", 0x100, (4, 4))
    column = _tensor("c.column", 0x400, (4,), stride=(4,))  # every 4th float of a 4x4 block
    index = uninit.Index([outer, inner, tied, column])
    assert [t.name for t in index.find(0x114)] == ["a.view", "a.weight"]
    assert [t.name for t in index.find(0x104)] == ["a.weight"] and index.find(0x140) == []
    assert column.elements(0x410, 4) == [1] and column.elements(0x414, 4) == []
    packed = _tensor("d.packed", 0x800, (2, 8), size=1)
    assert packed.elements(0x806, 4) == [6, 7, 8, 9]
    assert uninit.ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"


def test_a_record_file_is_checked_like_any_input(tmp_path):
    """A record that lies (a negative pointer, a shape that is not a list, no stage) is a clear error."""
    bad = {"records": [{"stage": BUILT, "tensors": [{"name": "x", "ptr": -1, "nbytes": 4, "element_size": 4,
                                                      "shape": [1]}]}]}
    with pytest.raises(SanitizerLogError, match=r"r\.records\[0\]\.tensors\[0\]\.ptr: expected a non-negative"):
        uninit.worker_record(bad, "r")
    with pytest.raises(SanitizerLogError, match="expected a stage"):
        uninit.worker_record({"records": [{"tensors": []}]}, "r")
    with pytest.raises(SanitizerLogError, match=r"PARAMS: x: expected \[start, end, element size, shape\]"):
        uninit.from_params_line({"x": [1, 2]}, "PARAMS")
    log = tmp_path / "sanitizer.7.log"
    log.write_text(TEXT.replace(next(x for x in LINES if x.startswith("PARAMS")), ""))
    with pytest.raises(SanitizerLogError, match="no parameter record"):
        sanitized.one_log(log, None)
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"workers": [{"pid": 1, "params": {"records": []}},
                                              {"pid": 2, "params": {"records": []}}]}))
    with pytest.raises(SanitizerLogError, match="2 engine workers and the log's name gives no pid of theirs"):
        sanitized.one_log(log, result)


def test_a_run_directory_maps_each_process_through_its_own_worker(tmp_path):
    """sanitizer.<pid>.log goes with the worker of that pid; another process's reads are scratch; a worker that
    held tensors but has no log is said (the sanitizer did not follow it)."""
    params = json.loads(next(x for x in LINES if x.startswith("PARAMS"))[7:])
    tensors = [{"name": n, "ptr": a, "nbytes": b - a, "element_size": s, "shape": sh, "experts": sh[0]}
               for n, (a, b, s, sh) in params.items()]
    worker = {"pid": 41, "params": {"requested": True, "records": [{"stage": BUILT, "tensors": tensors}]}}
    (tmp_path / "sanitizer.41.log").write_text(TEXT)
    (tmp_path / "sanitizer.40.log").write_text(TEXT)  # the engine child: no model there
    (tmp_path / "result.json").write_text(json.dumps({"workers": [worker, {**worker, "pid": 42}]}))
    run = sanitized.run_directory(tmp_path)
    assert [len(p.hits) for p in run.processes] == [0, 2] and sum(run.other.values()) == 17
    assert run.unreadable == ("no compute-sanitizer log for engine worker pid 42, the process that held the model: "
                              "the sanitizer did not follow it (pass --target-processes all)",)
    assert not run.ordered and run.attribution == sanitized.BY_PID


def test_one_log_named_by_the_sanitizer_s_own_pid_goes_with_the_one_worker_that_held_the_model(tmp_path):
    """Where `%p` is compute-sanitizer's pid (one log for every process it follows, named by no worker), the log is
    mapped through the only worker holding tensors, and says so; with two such workers nothing can be placed."""
    params = json.loads(next(x for x in LINES if x.startswith("PARAMS"))[7:])
    tensors = [{"name": n, "ptr": a, "nbytes": b - a, "element_size": s, "shape": sh, "experts": sh[0]}
               for n, (a, b, s, sh) in params.items()]
    worker = {"pid": 41, "params": {"requested": True, "records": [{"stage": BUILT, "tensors": tensors}]}}
    empty = {"pid": 43, "params": {"requested": True, "records": []}}  # a worker without the model
    (tmp_path / "sanitizer.7.log").write_text(TEXT)
    (tmp_path / "result.json").write_text(json.dumps({"workers": [worker, empty]}))
    run = sanitized.run_directory(tmp_path)
    assert (run.unreadable, [len(p.hits) for p in run.processes], run.other) == ((), [2], {})
    assert run.attribution == ("sanitizer.7.log is named by no worker's pid (compute-sanitizer's own: one log for "
                               "every process it followed), mapped through the one worker that held the model, "
                               "pid 41")
    (tmp_path / "result.json").write_text(json.dumps({"workers": [worker, {**worker, "pid": 42}]}))
    run = sanitized.run_directory(tmp_path)
    assert run.unreadable == ("the logs' names (sanitizer.7.log) give no pid of the 2 engine workers that held the "
                              "model (pids 41, 42), so no read can be placed in a process",)
    assert [len(p.hits) for p in run.processes] == [0]


def test_reading_a_log_is_streamed_and_an_unreadable_one_is_named(tmp_path):
    """Through the bounded reader: a missing file, a FIFO and a result nested past Python's stack are named."""
    path = tmp_path / "a.log"
    path.write_text(TEXT)
    assert len(initcheck.read(path).reports) == 17
    with pytest.raises(SanitizerLogError, match="cannot read the sanitizer's log"):
        initcheck.read(tmp_path / "missing.log")
    os.mkfifo(tmp_path / "fifo.log")  # nothing writes it: reading would hang, so it is refused unopened
    with pytest.raises(SanitizerLogError, match=r"fifo.log: cannot read the sanitizer's log \(not a regular file "
                                                r"\(a FIFO\)"):
        initcheck.read(tmp_path / "fifo.log")
    (tmp_path / "result.json").write_text("[" * 100_000)
    with pytest.raises(SanitizerLogError, match="result.json: not a readable JSON file"):
        sanitized.run_directory(tmp_path)
