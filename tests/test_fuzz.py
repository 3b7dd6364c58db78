"""Property-based fuzzing of every input quantmatrix reads from outside: matrices (mutated copies of the real
ones), checkpoint directories (a real safetensors file and config, corrupted), JUnit files and previous
summaries. The property is the CLI's rule: a result, or the module's own error (exit 2) naming the file, never
another exception (a traceback, exit 3), never a hang; and every summary.json written is strict JSON.

Example counts are fixed (1,200 matrices, 400 checkpoints, 400 JUnit and summary files) and the example
database is off, so the run is the same size every time; each example runs under an alarm that turns a hang
into a failure."""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import random
import shutil
import signal
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from quantmatrix import cli
from quantmatrix.errors import MatrixError, ReportError
from quantmatrix.report.build import build, summary_json
from quantmatrix.report.diff import load_previous
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parents[1]
HANG_S = 20
SLOWEST: dict[str, float] = {}


def fuzz(examples: int) -> settings:
    """Fixed size, no example database, no per-example deadline (the alarm in `bounded` catches hangs)."""
    return settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


@contextlib.contextmanager
def bounded(kind: str) -> Iterator[None]:
    """Fail an example that runs past HANG_S seconds (a hang), and keep the slowest time per kind."""
    def alarm(*_):
        raise TimeoutError(f"{kind}: one input ran past {HANG_S} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    start = time.perf_counter()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        SLOWEST[kind] = max(SLOWEST.get(kind, 0.0), time.perf_counter() - start)


# ------------------------------------------------------------------------------------------------ matrices

TOKENS = ["true", "1.0", "!!int x", "!!timestamp x", "!!bool maybe", "2027-02-30", "[", "{", "~", "''", "null",
          '"\\ud800"', "9" * 4400, '"1.²"', '"١٢.٠"', "&a x", "*a", "!!python/object:os.system x", "- -", ":",
          "{a: [b, {c: d}]}", "0x1F", "-1", ".nan", "12.1", "[12, 1]", "@", "`", "%YAML 1.1", "? x", "|", ">"]
LINES = {name: (ROOT / "matrices" / name).read_text(encoding="utf-8").splitlines() for name in
         ("default.yaml", "real.yaml")}


@st.composite
def mutated_matrix(draw: st.DrawFn) -> bytes:
    lines = list(LINES[draw(st.sampled_from(sorted(LINES)))])
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "value", "indent", "tag", "deep", "raw"]))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "value" and ":" in lines[i]:
            head = lines[i].split(":", 1)[0]
            lines[i] = f"{head}: {draw(st.sampled_from(TOKENS))}"
        elif op == "indent":
            lines[i] = " " * draw(st.integers(0, 6)) + lines[i].lstrip()
        elif op == "tag":
            lines[i] = lines[i].replace(": ", f": {draw(st.sampled_from(['!!str', '!!int', '!!float', '!!map']))} ", 1)
        elif op == "deep":
            depth = draw(st.integers(50, 1500))
            lines.insert(i, "deep: " + "[" * depth + "]" * depth)
        else:
            lines[i] = draw(st.text(max_size=40))
    text = "\n".join(lines) + "\n"
    encoding = draw(st.sampled_from(["utf-8"] * 6 + ["latin-1", "utf-16", "nul"]))
    if encoding == "nul":
        return text.encode("utf-8", "surrogatepass").replace(b"\n", b"\n\x00", 1)
    return text.encode(encoding, "replace") if encoding != "utf-8" else text.encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def matrix_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of matrices/ (its prompts and task files), where the mutated matrices are written."""
    d = tmp_path_factory.mktemp("fuzz-matrices")
    shutil.copytree(ROOT / "matrices", d / "matrices")
    (d / ".git").mkdir()  # a repository holding matrices/ and the references beside it
    return d / "matrices"


@fuzz(1200)
@given(data=mutated_matrix())
def test_a_mutated_matrix_loads_or_is_refused_with_file_line_column(matrix_dir, data):
    """load() returns a matrix or raises MatrixError starting with the file's path and line:column; `list`
    over it exits 0 or 2, never 3."""
    path = matrix_dir / "m.yaml"
    path.write_bytes(data)
    with bounded("matrix"):
        try:
            m = load(path)
        except MatrixError as e:
            assert str(e).startswith(f"{path}"), e
            event("refused")
            m = None
        if m is not None:
            for cell in m.cells():
                cell.id.encode("utf-8")  # a lone surrogate anywhere would crash a terminal or a file
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            rc = cli.main(["list", "--matrix", str(path)])
    assert rc == (0 if m is not None else 2), err.getvalue()


# --------------------------------------------------------------------------------------------- checkpoints


def _checkpoint(d: Path) -> None:
    """A small NVFP4-shaped ModelOpt checkpoint: packed weight, block scale, global and input scales."""
    d.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for e in range(2):
        p = f"model.layers.0.mlp.experts.{e}.down_proj"
        tensors[f"{p}.weight"] = np.zeros((8, 16), np.uint8)
        tensors[f"{p}.weight_scale"] = np.ones((8, 2), np.uint8)
        tensors[f"{p}.weight_scale_2"] = np.ones((), np.float32)
        tensors[f"{p}.input_scale"] = np.ones((), np.float32)
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({
        "model_type": "qwen3_moe", "num_experts": 2,
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head"],
                                "config_groups": {"g": {"input_activations": {"num_bits": 4}}}}}))


def corrupted_checkpoint() -> st.SearchStrategy[tuple[list[str], random.Random]]:
    """Which corruptions to apply, in order, and the seeded randomness that places them."""
    ops = st.lists(st.sampled_from(["flip", "length", "truncate", "json", "config", "ignore", "experts"]),
                   min_size=1, max_size=3)
    return st.tuples(ops, st.randoms(use_true_random=False))


CONFIG_VALUES = [[], "x", 1, None, {"quantization_config": []}, {"quantization_config": {"quant_method": 3}},
                 {"num_experts": 10 ** 9}, {"num_experts": "2"}, {"quantization_config": {"quant_method": "modelopt",
                  "quant_algo": "NVFP4", "ignore": ["re:(a+)+$"]}}, {"quantization_config": {
                  "quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": "lm_head"}}]
HEADER_VALUES = [None, 1, "x", [], {}, {"dtype": "F32"}, {"dtype": 3, "shape": [], "data_offsets": [0, 4]},
                 {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]},
                 {"dtype": "F32", "shape": [], "data_offsets": [4, 0]},
                 {"dtype": "F32", "shape": [], "data_offsets": [0, 2 ** 40]}]


def _corrupt(d: Path, ops: list[str], rnd: random.Random) -> None:
    st_file, cfg = d / "model.safetensors", d / "config.json"
    raw = bytearray(st_file.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    for op in ops:
        if op == "flip" and raw:
            for _ in range(rnd.randint(1, 8)):
                raw[rnd.randrange(len(raw))] = rnd.randrange(256)
        elif op == "length":
            raw[:8] = struct.pack("<Q", rnd.choice([0, 7, n - 1, n + 1, 2 ** 40, 2 ** 63]))
        elif op == "truncate" and raw:
            raw = raw[: rnd.randrange(len(raw))]
        elif op == "json":
            try:  # an earlier corruption may have broken the header already
                header = json.loads(bytes(raw[8:8 + n]))
                assert isinstance(header, dict) and header
            except (ValueError, AssertionError):
                continue
            key = rnd.choice(sorted(header))
            header[key] = rnd.choice(HEADER_VALUES) if rnd.random() < 0.7 else [header[key]]
            body = json.dumps(header).encode()
            raw = bytearray(struct.pack("<Q", len(body)) + body + raw[8 + n:])
        elif op == "config":
            cfg.write_text(json.dumps(rnd.choice(CONFIG_VALUES)))
        elif op == "ignore":
            conf = json.loads(cfg.read_text()) if cfg.read_text().startswith("{") else {}
            conf.setdefault("quantization_config", {"quant_method": "modelopt", "quant_algo": "NVFP4"})
            if isinstance(conf["quantization_config"], dict):
                conf["quantization_config"]["ignore"] = [rnd.choice(["re:(a+)+$", "re:(", "re:.*", "*", "re:a{2,}+"])]
            cfg.write_text(json.dumps(conf))
        elif op == "experts":
            conf = json.loads(cfg.read_text()) if cfg.read_text().startswith("{") else {}
            conf["num_experts"] = rnd.choice([0, 3, 1_000_000, -1, 2.5, "2"])
            cfg.write_text(json.dumps(conf))
    st_file.write_bytes(bytes(raw))


@fuzz(400)
@given(case=corrupted_checkpoint())
def test_a_corrupted_checkpoint_lints_or_is_refused_naming_the_file(tmp_path_factory, case):
    """`quantmatrix lint` exits 0 (clean), 1 (findings) or 2 with a message naming the checkpoint: no traceback,
    no hang (backtracking regexes, huge headers), no memory blow-up (a million experts)."""
    ops, rnd = case
    d = tmp_path_factory.mktemp("ck")
    _checkpoint(d)
    _corrupt(d, ops, rnd)
    with bounded("checkpoint"), contextlib.redirect_stdout(io.StringIO()) as out, \
            contextlib.redirect_stderr(io.StringIO()) as err:
        rc = cli.main(["lint", str(d), "--block-scales"])
    assert rc in (0, 1, 2), err.getvalue()
    if rc == 2:
        assert f"quantmatrix lint: error: {d}" in err.getvalue(), err.getvalue()
        event("refused: " + err.getvalue().replace(str(d), "").split(":")[3].strip()[:30])
    else:
        event("linted")
        assert len(out.getvalue().splitlines()) < 200


# ------------------------------------------------------------------------------------ JUnit and summaries

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="0" tests="3" time="1.0"
 timestamp="2026-12-02T01:02:03">
<properties><property name="vllm_version" value="0.32.0"/><property name="runner" value="r1"/></properties>
<testcase classname="suites.test_dispatch" name="test_config_dispatch[ck@sm121-default]" time="0.5">
<properties><property name="checkpoint" value="ck"/><property name="arch" value="sm121"/>
<property name="mode" value="default"/><property name="check" value="config_dispatch"/></properties></testcase>
<testcase classname="suites.test_dispatch" name="test_config_dispatch[ck@sm120-default]" time="0.25">
<failure message="weight-only routed to W4A4">log line</failure></testcase>
<testcase classname="suites.test_layers" name="test_layer_dispatch[ck@sm121-eager]" time="0.1">
<skipped message="needs sm121"/></testcase>
</testsuite></testsuites>
"""
SNIPPETS = ['time="nan"', 'time="inf"', 'time="-1"', "<testsuite>" * 50, "</testsuite>", "<testcase/>",
            '<!DOCTYPE x [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;">]>', "&b;", "<![CDATA[x]]>",
            '<property name="waiver_reason" value="r"/>', 'name="x`\n<img src=x>"', '<error message="e"/>',
            "\x00", "é", '<property name="vllm_health" value="broken: config (x)"/>']


@st.composite
def mutated_junit(draw: st.DrawFn) -> bytes:
    text = JUNIT
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["insert", "truncate", "nest", "attr", "bytes"]))
        i = draw(st.integers(0, len(text)))
        if op == "insert":
            text = text[:i] + draw(st.sampled_from(SNIPPETS)) + text[i:]
        elif op == "truncate":
            text = text[:i]
        elif op == "nest":
            depth = draw(st.integers(100, 5000))
            text = text.replace("<testsuite ", "<testsuite>" * depth + "<testsuite ", 1).replace(
                "</testsuite>", "</testsuite>" * (depth + 1), 1)
        elif op == "attr":
            text = text.replace('time="0.5"', draw(st.sampled_from(SNIPPETS[:3] + ['time="x"'])), 1)
        else:
            text = text[:i] + draw(st.text(max_size=20)) + text[i:]
    return text.encode("utf-8", "surrogatepass")


def _strict(text: str) -> object:
    def refuse(name: str) -> None:
        raise ValueError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@fuzz(300)
@given(data=mutated_junit())
def test_a_mutated_junit_file_merges_or_is_named_bad_and_the_summary_stays_strict_json(tmp_path_factory, data):
    """`quantmatrix report` exits 0 or 1 on a file it could read and 2 naming one it could not, never 3; every
    summary.json it writes is strict JSON (no NaN), whatever the file held."""
    d = tmp_path_factory.mktemp("junit")
    (d / "j.xml").write_bytes(data)
    with bounded("junit"), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()) as err:
        rc = cli.main(["report", str(d / "j.xml"), "--out", str(d / "out"), "--jobs", "1"])
    assert rc in (0, 1, 2), err.getvalue()
    summary = _strict((d / "out" / "summary.json").read_text())
    bad = summary["bad_inputs"]
    assert (rc == 2) == bool(bad) and (not bad or f"bad input {d / 'j.xml'}" in err.getvalue())
    event("bad input" if bad else "merged")


@st.composite
def mutated_summary(draw: st.DrawFn) -> dict:
    good = json.loads(SUMMARY)
    target = draw(st.sampled_from(["top", "night", "case", "input"]))
    junk = draw(st.sampled_from([None, 1, "x", [], {}, [1], 2.5, True, {"night": 1}, "passed@x " * 20]))
    if target == "top":
        good[draw(st.sampled_from(sorted(good)))] = junk
    elif target == "night" and good["nights"]:
        good["nights"][0] = junk if draw(st.booleans()) else {**good["nights"][0], "night": junk}
    elif target == "case":
        key = sorted(good["cases"])[0]
        field = draw(st.sampled_from(["outcome", "properties", "history", "file", None]))
        good["cases"][key] = junk if field is None else {**good["cases"][key], field: junk}
    elif good["inputs"]:
        good["inputs"][0] = junk if draw(st.booleans()) else {**good["inputs"][0], "common": junk}
    return good


SUMMARY = ""


@pytest.fixture(scope="module", autouse=True)
def _summary(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[None]:
    """A real summary.json of the JUnit template (the base the summary mutations start from); at the end, the
    slowest single input per kind goes to the terminal."""
    global SUMMARY
    d = tmp_path_factory.mktemp("summary")
    (d / "j.xml").write_text(JUNIT)
    SUMMARY = summary_json(build([str(d / "j.xml")], None, night="n0", date=datetime.date(2026, 12, 1)))
    yield
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None and SLOWEST:
        with capture.global_and_fixture_disabled():
            reporter.write_line("\nfuzz: slowest input per kind: " +
                                ", ".join(f"{k} {v:.2f} s" for k, v in sorted(SLOWEST.items())))


@fuzz(100)
@given(summary=mutated_summary())
def test_a_mutated_previous_summary_is_used_or_refused_naming_the_file(tmp_path_factory, summary):
    d = tmp_path_factory.mktemp("prev")
    path = d / "summary.json"
    path.write_text(json.dumps(summary))
    (d / "j.xml").write_text(JUNIT)
    with bounded("summary"):
        try:
            load_previous(path)
            build([str(d / "j.xml")], path, night="n1", date=datetime.date(2026, 12, 2))
        except ReportError as e:
            assert str(path) in str(e), e


# ---------------------------------------------------------------------------------- round 2 (issue 31)
# The shared pieces every reader and printer goes through, each with its property: nothing untrusted prints raw,
# no pattern hangs or escapes as another exception, no one-byte float is misjudged, no expert is miscounted.


@fuzz(400)
@given(text=st.text(alphabet=st.characters(), max_size=200))
def test_shown_text_is_one_printable_line_any_terminal_and_file_can_take(text):
    from quantmatrix.bounded import shown

    out = shown(text)
    assert out.isprintable() and "\n" not in out
    out.encode("utf-8")  # no lone surrogate survives
    if text.isprintable():
        assert out == text  # nothing printable is changed


@fuzz(400)
@given(pattern=st.text(alphabet=st.sampled_from("ab.*+?|()[]{}^$\\0123456789,-=!<:"), max_size=40),
       name=st.text(alphabet="ab.", max_size=2000))
def test_a_regex_compiles_or_is_named_and_never_hangs(pattern, name):
    from quantmatrix.bounded import InputError, regex

    with bounded("regex"):
        try:
            compiled = regex(pattern)
        except InputError as e:
            assert "not a regular expression RE2 matches in linear time" in str(e)
            return
        compiled.search(name)
        compiled.match(name)


ONE_BYTE_FLOATS = [t for t in (getattr(__import__("torch"), n, None) for n in (
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")) if t is not None]


@fuzz(200)
@given(raw=st.binary(min_size=1, max_size=256), which=st.integers(0, len(ONE_BYTE_FLOATS) - 1))
def test_a_one_byte_float_is_judged_finite_exactly_where_its_value_is(raw, which):
    import torch

    from quantmatrix.measure import findings

    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(ONE_BYTE_FLOATS[which])
    truth = torch.isfinite(t.float())
    assert torch.equal(findings.finite_mask(t), truth)
    assert findings.all_finite(t) == bool(truth.all())


@fuzz(300)
@given(index=st.text(alphabet=st.sampled_from("0123456789\u0661\u00b2\u0966x"), min_size=1, max_size=4))
def test_an_expert_counts_exactly_when_vllm_would_name_it_so(index):
    from quantmatrix.checkpoints import experts

    module = f"model.layers.0.mlp.experts.{index}.down_proj"
    layers, found = experts._layers({module: {}})
    vllm_name = index.isascii() and index.isdigit() and str(int(index)) == index
    assert bool(layers) == vllm_name
    assert bool(found) == (not vllm_name and index.isnumeric())
