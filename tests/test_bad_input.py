"""Every bad input issue 14 found, as its minimal case, through the command a user runs: a clear message naming the
file (and line:column or tensor) with exit 2, findings 1, success 0, a bug 3 with a log; never a traceback."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from quantmatrix import cli
from quantmatrix.checkpoints import store
from quantmatrix.report import render_md

ROOT = Path(__file__).resolve().parents[1]
# The default matrix with its waivers emptied: the cases below write their own (or other) YAML in that place.
BASE = re.sub(r"^waivers:\n(?:[ #].*\n|\n(?=[ #]))*", "waivers: []\n",
              (ROOT / "matrices" / "default.yaml").read_text(encoding="utf-8"), count=1, flags=re.M)
assert "waivers: []\n" in BASE


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = cli.main(list(argv))
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    return rc, cap.err


@pytest.fixture
def matrices(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "matrices", tmp_path / "matrices")
    (tmp_path / ".git").mkdir()  # a repository holding matrices/ and the references beside it
    return tmp_path / "matrices"


# ------------------------------------------------------------------------------------------------ matrices

MATRIX_CASES = {
    "not-utf8": (BASE.encode() + "# caf\xe9\n".encode("latin-1"), r":\d+:6: not UTF-8 \(byte 0xe9\)"),
    "deep": (("version: 1\narchs: " + "[" * 1000 + "]" * 1000 + "\n").encode(), r":2:\d+: not valid YAML"),
    "bad-date": (BASE.replace("waivers: []", "waivers:\n  - match: {arch: sm121}\n    reason: r\n    link: l\n"
                              "    expires: 2027-02-30").encode(), r"expires: '2027-02-30' is not a valid timestamp"),
    "int-tag": (BASE.replace("version: 1", "version: !!int x").encode(), r":3:10: matrix.version: 'x' is not a "
                                                                         "valid int"),
    "timestamp-tag": (BASE.replace("version: 1", "version: !!timestamp x").encode(), r"is not a valid timestamp"),
    "bool-tag": (BASE.replace("version: 1", "version: !!bool maybe").encode(), r"'maybe' is not a valid bool"),
    "huge-int": (BASE.replace("version: 1", "version: " + "9" * 4301).encode(), r"is not a valid int"),
    "superscript": (BASE.replace('capability: "12.0"', 'capability: "1.²"').encode(),
                    r"capability: expected 'MAJOR.MINOR'"),
    "arabic-digits": (BASE.replace('capability: "12.0"', 'capability: "١٢.٠"').encode(),
                      r"capability: expected 'MAJOR.MINOR'"),
    "surrogate": (BASE.replace("label: B200", 'label: "\\ud800"').encode(), r"invalid Unicode character escape"),
    "nul": (BASE.replace("archs:", "archs:\x00", 1).encode(), r":5:7: not valid YAML: unprintable character #x00"),
    "version-true": (BASE.replace("version: 1", "version: true").encode(), r"matrix.version: expected one of 1; "
                                                                           "got True"),
    "version-float": (BASE.replace("version: 1", "version: 1.0").encode(), r"matrix.version: expected one of 1; "
                                                                           "got 1.0"),
    "hub-revision": (BASE.replace("source: {synthetic: {model: mixtral}}",
                                  "source: {hub: org/name, revision: ../../etc}").encode(),
                     r"revision '../../etc' is neither a 40-hex commit nor a plain branch or tag name"),
    "hub-repo": (BASE.replace("source: {synthetic: {model: mixtral}}", "source: {hub: 'org/x;rm -rf ~'}").encode(),
                 r"hub id 'org/x;rm -rf ~' is not owner/name"),
}


@pytest.mark.parametrize("name", sorted(MATRIX_CASES))
def test_a_bad_matrix_is_exit_2_with_file_line_column(name, matrices, capsys):
    data, message = MATRIX_CASES[name]
    path = matrices / "m.yaml"
    path.write_bytes(data)
    rc, err = _run(capsys, "list", "--matrix", str(path))
    assert rc == 2, err
    assert err.startswith(f"quantmatrix list: error: {path}"), err
    assert re.search(message, err), err


def test_a_lone_surrogate_is_refused_by_the_pure_python_yaml_loader_too(matrices, capsys, monkeypatch):
    """libyaml refuses surrogate escapes itself; PyYAML's pure-Python loader (a host without libyaml) builds
    "\\U0000D800" into a lone surrogate, which the loader's own check refuses with its line:column."""
    import yaml

    from quantmatrix.schema import load as loader

    monkeypatch.setattr(loader, "_LOADER", yaml.SafeLoader)
    path = matrices / "m.yaml"
    path.write_text(BASE.replace("label: B200", 'label: "\\U0000D800"'))
    rc, err = _run(capsys, "list", "--matrix", str(path))
    assert rc == 2 and re.search(r":9:12: archs\[0\]\.label: the text holds a lone surrogate escape", err), err


def test_a_prompts_file_that_is_not_utf8_is_named(matrices, capsys):
    (matrices / "prompts" / "greedy.txt").write_bytes(b"caf\xe9\n")
    rc, err = _run(capsys, "list", "--matrix", str(matrices / "default.yaml"))
    assert rc == 2 and "e2e.prompts:" in err and "greedy.txt is not UTF-8 (byte 3)" in err, err


def test_an_internal_error_is_exit_3_with_the_traceback_in_a_log(monkeypatch, capsys):
    """A bug never looks like a verdict: exit 3, one line naming the log that holds the traceback."""
    from quantmatrix.cli import matrix

    def boom(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(matrix, "cmd_list", boom)
    rc, err = _run(capsys, "list")
    assert rc == 3 and "internal error, please report: ZeroDivisionError: a bug (traceback in " in err
    log = Path(err.rsplit("(traceback in ", 1)[1].split(")")[0])
    assert "ZeroDivisionError" in log.read_text()
    log.unlink()


# --------------------------------------------------------------------------------------------- checkpoints


def _checkpoint(d: Path, config: object | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    save_file({"model.layers.0.mlp.experts.0.down_proj.weight": np.zeros((4, 4), np.float32),
               "model.layers.0.mlp.experts.1.down_proj.weight": np.zeros((4, 4), np.float32)},
              str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(config if config is not None else
                                              {"model_type": "qwen3_moe", "num_experts": 2}))
    return d


def _rewrite_header(d: Path, edit) -> None:
    f = d / "model.safetensors"
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    edited = edit(header)
    body = json.dumps(edited).encode()
    f.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n:])


def _length(value: int):
    def edit(d: Path) -> None:
        f = d / "model.safetensors"
        raw = f.read_bytes()
        f.write_bytes(struct.pack("<Q", value) + raw[8:])
    return edit


def _header(edit):
    return lambda d: _rewrite_header(d, edit)


W0 = "model.layers.0.mlp.experts.0.down_proj.weight"
W1 = "model.layers.0.mlp.experts.1.down_proj.weight"
LINT_CASES = {
    "length-2^63": (_length(2 ** 63), "header length 9223372036854775808 exceeds the file"),
    "length-2^40": (_length(2 ** 40), "header length 1099511627776 exceeds the file"),
    "truncated-data": (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-8]),
                       "lie outside the"),
    "offset-out-of-range": (_header(lambda h: h | {W0: h[W0] | {"data_offsets": [0, 10 ** 9]}}), "lie outside"),
    "offset-negative": (_header(lambda h: h | {W0: h[W0] | {"data_offsets": [-64, 0]}}), "lie outside"),
    "no-dtype": (_header(lambda h: h | {W0: {k: v for k, v in h[W0].items() if k != "dtype"}}),
                 "dtype 'None' is not a safetensors dtype"),
    "no-offsets": (_header(lambda h: h | {W0: {k: v for k, v in h[W0].items() if k != "data_offsets"}}),
                   "data_offsets must be [begin, end] integers"),
    "header-list": (_header(lambda h: [h]), "the safetensors header is list, not an object"),
    "overlapping": (_header(lambda h: h | {W1: h[W1] | {"data_offsets": h[W0]["data_offsets"]}}),
                    "overlap or leave a gap"),
    "reversed": (_header(lambda h: h | {W0: h[W0] | {"data_offsets": h[W0]["data_offsets"][::-1]}}),
                 "lie outside"),
    "directory": (lambda d: (d / "extra.safetensors").mkdir(), "extra.safetensors: not a regular file"),
    "fifo": (lambda d: os.mkfifo(d / "extra.safetensors"), "extra.safetensors: not a regular file"),
    "symlink-out": (lambda d: (d / "extra.safetensors").symlink_to("/etc/hostname"), "links outside the checkpoint"),
    "config-list": (lambda d: (d / "config.json").write_text("[]"), "config.json is list, not an object"),
    "quant-config-string": (lambda d: (d / "config.json").write_text('{"quantization_config": "x"}'),
                            "quantization_config is str, not an object"),
    "million-experts": (lambda d: (d / "config.json").write_text('{"num_experts": 1000000}'),
                        "num_experts 1000000 is not an integer from 0 to 65536"),
    # RE2 matches `(a+)+$` in linear time (test_an_ignore_pattern_cannot_hang); a lookahead it cannot run is refused
    "lookahead-ignore": (lambda d: (d / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["re:(?=a)"]}})),
        "ignore pattern '(?=a)' is not a regular expression RE2 matches in linear time"),
}


@pytest.mark.parametrize("name", sorted(LINT_CASES))
def test_a_corrupted_checkpoint_is_exit_2_naming_the_file(name, tmp_path, capsys):
    corrupt, message = LINT_CASES[name]
    d = _checkpoint(tmp_path / "ck")
    corrupt(d)
    rc, err = _run(capsys, "lint", str(d))
    assert rc == 2, err
    assert message in err and str(d) in err, err


def test_lint_findings_are_exit_1_and_a_clean_checkpoint_exit_0(tmp_path, capsys):
    """The rule's other two codes: a missing expert is a finding (1); the intact file is clean (0)."""
    d = _checkpoint(tmp_path / "ck")
    assert _run(capsys, "lint", str(d))[0] == 0
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 3}))
    assert _run(capsys, "lint", str(d))[0] == 1


def test_thousands_of_missing_experts_are_summarised(tmp_path, capsys):
    d = _checkpoint(tmp_path / "ck", {"model_type": "qwen3_moe", "num_experts": 60000})
    rc = cli.main(["lint", str(d), "--json"])
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert rc == 1 and len(findings) == 17
    assert findings[-1]["message"] == "and 59982 more experts (up to 59999) have no down_proj either"


# ------------------------------------------------------------------------------------------------- reports

JUNIT = ('<testsuites><testsuite name="s">{body}<testcase classname="c" name="{name}" time="{time}">'
         '<failure message="m"/></testcase></testsuite></testsuites>')


def test_five_thousand_nested_suites_merge(tmp_path, capsys):
    f = tmp_path / "deep.xml"
    f.write_text("<testsuites>" + "<testsuite>" * 5000 + '<testcase classname="c" name="t"/>' +
                 "</testsuite>" * 5000 + "</testsuites>")
    rc, err = _run(capsys, "report", str(f), "--out", str(tmp_path / "out"))
    assert rc == 0, err
    assert list(json.loads((tmp_path / "out" / "summary.json").read_text())["cases"]) == ["c::t"]


def test_a_nan_time_keeps_summary_json_strict(tmp_path, capsys):
    f = tmp_path / "j.xml"
    f.write_text(JUNIT.format(body="", name="t", time="nan"))
    _run(capsys, "report", str(f), "--out", str(tmp_path / "out"))
    text = (tmp_path / "out" / "summary.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"summary.json holds {c}"))


def test_case_names_and_waiver_links_cannot_inject_markdown_or_html(tmp_path, capsys):
    """A case name with a newline and an <img> stays inside one code span; a waiver link that would close the
    Markdown link and open an image is shown as text, not linked."""
    f = tmp_path / "j.xml"
    props = ('<properties><property name="waiver_reason" value="r"/><property name="waiver_expires" '
             'value="2999-01-01"/><property name="waiver_link" value="https://x)![a](https://evil/i.png"/>'
             '</properties>')
    f.write_text('<testsuites><testsuite name="s"><testcase classname="c" name="t&#10;&lt;img src=x onerror=a&gt;">'
                 f'{props}<skipped type="pytest.xfail" message="w"/></testcase></testsuite></testsuites>')
    _run(capsys, "report", str(f), "--out", str(tmp_path / "out"))
    md = (tmp_path / "out" / "matrix.md").read_text()
    assert "\n<img" not in md and "[a](" not in md  # the brackets are escaped: no image, no link
    assert "`c::t <img src=x onerror=a>`" in md


def test_matrix_md_stays_under_the_step_summary_limit():
    long = "| row |\n" * 300_000
    out = render_md.bounded(long)
    assert len(out.encode()) <= render_md.MD_LIMIT and out.endswith("index.html and summary.json**\n")


@pytest.mark.parametrize("edit, message", [
    (lambda s: s | {"nights": "x"}, "previous summary is malformed"),
    (lambda s: s | {"nights": s["nights"][:0]}, "nights of history, the summary names 0"),
    (lambda s: s | {"cases": {k: v | {"properties": []} for k, v in s["cases"].items()}},
     "malformed properties"),
])
def test_a_previous_summary_of_the_wrong_shape_is_exit_2(tmp_path, capsys, edit, message):
    f = tmp_path / "j.xml"
    f.write_text(JUNIT.format(body="", name="t", time="1"))
    _run(capsys, "report", str(f), "--out", str(tmp_path / "n1"), "--night", "n1")
    _run(capsys, "report", str(f), "--out", str(tmp_path / "n2"), "--night", "n2", "--previous",
         str(tmp_path / "n1" / "summary.json"))
    prev = tmp_path / "n2" / "summary.json"
    prev.write_text(json.dumps(edit(json.loads(prev.read_text()))))
    rc, err = _run(capsys, "report", str(f), "--out", str(tmp_path / "n3"), "--night", "n3", "--previous",
                   str(prev))
    assert rc == 2 and str(prev) in err and message in err, err


# ----------------------------------------------------------------------------------------------------- hub


def test_the_printed_download_line_is_shell_quoted():
    assert store.download_command("org/name", "main") == "hf download org/name --revision main"
    assert store.download_command("org/x;rm -rf ~", "main") == "hf download 'org/x;rm -rf ~' --revision main"


def test_resolving_a_hub_revision_never_leaves_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(store.CheckpointUnavailable, match="revision '../../etc' is neither"):
        store.resolve_hub("org/name", "../../etc")


def test_a_suite_property_without_a_value_reads_as_empty(tmp_path, capsys):
    """Found by the fuzzer: <property name="vllm_version"/> (no value) crashed the diff's version handling."""
    f = tmp_path / "j.xml"
    f.write_text('<testsuites><testsuite name="s"><properties><property name="vllm_version"/></properties>'
                 '<testcase classname="c" name="t"/></testsuite></testsuites>')
    rc, err = _run(capsys, "report", str(f), "--out", str(tmp_path / "out"))
    assert rc == 0, err


# ================================================================================ round 2 (issue 31)
# Each class the second corpus found, as its minimal case through the command a user runs. A hang is turned into a
# failure by an alarm; every case is exit 2 naming the file (and line:column or key), or a named finding (exit 1).


@pytest.fixture(autouse=False)
def no_hang():
    def hung(*_: object) -> None:
        raise TimeoutError("hung: the input was read without bound")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _sparse(path: Path) -> Path:
    with path.open("wb") as f:
        f.truncate(8 << 30)
    return path


SELF_ALIAS = "waivers: []\n_s: &s {arch: [" + ",".join(["sm121"] * 200) + "]}\ninclude: [" + ", ".join(["*s"] * 1500)
ROUND2_MATRICES = {
    # what the matrix's own file is
    "matrix-fifo": (lambda d: _fifo(d / "m.yaml"), r"cannot read matrix: not a regular file \(a FIFO\)"),
    "matrix-sparse-8g": (lambda d: _sparse(d / "m.yaml"), "8589934592 bytes, over the 8 MiB cap for a matrix file"),
    # files the matrix names
    "prompts-fifo": (lambda d: (_fifo(d / "prompts" / "f.txt"), _edit(d, "prompts/greedy.txt", "prompts/f.txt")),
                     r":\d+:\d+: e2e.prompts: .*f.txt: not a regular file \(a FIFO\)"),
    "prompts-environ": (lambda d: _edit(d, "prompts/greedy.txt", "/proc/self/environ"),
                        r"e2e.prompts: /proc/.*environ: yields more than its 0 bytes"),
    "prompts-dev-zero": (lambda d: _edit(d, "prompts/greedy.txt", "/dev/zero"),
                         r"e2e.prompts: /dev/zero: not a regular file \(a character device\)"),
    # amplification
    "include-alias-1500": (lambda d: _edit(d, "waivers: []", SELF_ALIAS + "]"),
                           r":1:1: the matrix expands to \d+ YAML values \(aliases expanded\), over the 200000"),
    "exclude-200k-aliases": (lambda d: _edit(d, "waivers: []", "waivers: []\n_s: &s {arch: sm121}\nexclude: ["
                                             + ", ".join(["*s"] * 200_000) + "]"), r"over the 200000"),
    "label-2mb": (lambda d: _edit(d, "label: B200", "label: " + "x" * 2_000_000),
                  r":9:12: archs\[0\].label: a label is one line of at most 200 characters, got 2000000"),
    "max-cells": (lambda d: _edit(d, "version: 1", "version: 1\nmax_cells: 10"),
                  r"the matrix has \d+ cells \(checkpoints x archs x modes x layouts\), over its max_cells of 10"),
    # a regex no engine here can run, or Python's could not compile
    "rejected-because-lookahead": (lambda d: _edit(d, '"Unknown ModelOpt quant algo: W4A16_NVFP4"', '"(?=x)"'),
                                   r"rejected_because: not a regular expression RE2 matches in linear time"),
    # a matrix that means nothing or everything
    "check-in-include": (lambda d: _edit(d, "waivers: []", "waivers: []\ninclude: [{check: config_dispatch}]"),
                         r"include\[0\]: `check` selects cases, and include selects cells"),
    "check-in-cells": (lambda d: _edit(d, "except_cells: [{mode: [\"poison_*\", guard]}]",
                                       "except_cells: [{check: device_identity}]"),
                       r"checks\[\d+\].except_cells\[0\]: `check` selects cases"),
    "waiver-match-empty": (lambda d: _edit(d, "waivers: []", "waivers:\n  - {match: {}, reason: r, link: l, "
                                                             "expires: 2099-01-01}"),
                           r"waivers\[0\].match: a waiver must name a check or a checkpoint \(it names nothing\)"),
    "waiver-match-arch-only": (lambda d: _edit(d, "waivers: []", "waivers:\n  - {match: {arch: sm121, checkpoint: "
                                                                 "'*'}, reason: r, link: l, expires: 2099-01-01}"),
                               r"a waiver must name a check or a checkpoint \(it names checkpoint, arch\)"),
    "id-300": (lambda d: _edit(d, "id: qwen3moe-tiny-bf16\n", "id: " + "a" * 300 + "\n"),
               r"checkpoints\[\d+\].id: 'a+' is not an id \(.*at most 100 characters\)"),
    "env-nul": (lambda d: _edit(d, "env: {QUANTMATRIX_GUARD: refuse}", 'env: {QUANTMATRIX_GUARD: "re\\0fuse"}'),
                r"modes\[\d+\].env.QUANTMATRIX_GUARD: an environment value holds no NUL"),
    "env-300kb": (lambda d: _edit(d, "env: {QUANTMATRIX_GUARD: refuse}", "env: {QUANTMATRIX_GUARD: " + "x" * 300_000
                                  + "}"), r"at most 32768 characters \(got 300000\)"),
}


def _edit(d: Path, old: str, new: str) -> None:
    text = BASE if not (d / "m.yaml").exists() else (d / "m.yaml").read_text(encoding="utf-8")
    assert old in text, old
    (d / "m.yaml").write_text(text.replace(old, new, 1), encoding="utf-8")


@pytest.mark.parametrize("name", sorted(ROUND2_MATRICES))
def test_round2_a_hostile_matrix_is_exit_2_naming_the_file(name, matrices, capsys, no_hang):
    make, message = ROUND2_MATRICES[name]
    make(matrices)
    path = matrices / "m.yaml"  # trusted: files outside the repository are read too, and still bounded
    rc, err = _run(capsys, "list", "--matrix", str(path), "--trust-matrix")
    assert rc == 2, err
    assert err.startswith(f"quantmatrix list: error: {path}"), err
    assert re.search(message, err), err


def test_round2_the_matrix_may_be_a_device_and_is_still_refused(capsys, no_hang):
    rc, err = _run(capsys, "list", "--matrix", "/dev/zero")
    assert rc == 2 and "/dev/zero: cannot read matrix: not a regular file (a character device)" in err, err


# ------------------------------------------------------------------------------ round 2: checkpoints


def _index(d: Path, weight_map: dict[str, str]) -> None:
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _rename(old: str, new: str):
    return _header(lambda h: {(new if k == old else k): v for k, v in h.items()})


def _link(d: Path, name: str, target: Path) -> None:
    (d / name).symlink_to(target)


NV = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
ROUND2_LINT_ERRORS = {
    "shard-symlink-loop": (lambda d: (_link(d, "b.safetensors", d / "c.safetensors"),
                                      _link(d, "c.safetensors", d / "b.safetensors")),
                           "b.safetensors: cannot be opened (Symlink loop"),
    "dangling-shard": (lambda d: _link(d, "b.safetensors", d / "nowhere"), "b.safetensors: cannot be opened"),
    "index-outside": (lambda d: _index(d, {W0: "../x.safetensors"}), "names '../x.safetensors', outside the "
                                                                     "checkpoint directory"),
    "index-not-json": (lambda d: (d / "model.safetensors.index.json").write_text("{nope"),
                       "model.safetensors.index.json: cannot read the shard index"),
    "index-fifo": (lambda d: _fifo(d / "model.safetensors.index.json"),
                   "model.safetensors.index.json: not a regular file"),
    "index-weight-map-list": (lambda d: (d / "model.safetensors.index.json").write_text('{"weight_map": []}'),
                              "weight_map is list, not an object"),
    "config-fifo": (lambda d: ((d / "config.json").unlink(), _fifo(d / "config.json")),
                    "config.json: not a regular file (a FIFO)"),
    "config-dev-zero": (lambda d: ((d / "config.json").unlink(), _link(d, "config.json", Path("/dev/zero"))),
                        "not a regular file (a character device)"),
    "config-groups-string": (lambda d: (d / "config.json").write_text(json.dumps(
        {"num_experts": 2, "quantization_config": {**NV, "config_groups": "g"}})),
        "quantization_config.config_groups is a str, not a mapping"),
    "legacy-config-groups-list": (lambda d: (d / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {"quant_algo": "NVFP4"}, "config_groups": ["g"]})),
        "hf_quant_config.json: config_groups is a list, not a mapping"),
    "header-the-library-refuses": (_header(lambda h: h | {W0: h[W0] | {"shape": [4, 5]}}),
                                   "safetensors 0.8.0 refuses the file: Error while deserializing header"),
    "projections-x-experts": (lambda d: ((d / "config.json").write_text('{"num_experts": 65536}'), save_file(
        {f"model.layers.0.mlp.experts.0.p{i}.weight": np.zeros(1, np.float32) for i in range(100)},
        str(d / "model.safetensors"))), "100 distinct projection names under its experts, over the 64"),
    "million-globs": (lambda d: (d / "config.json").write_text(json.dumps(
        {"num_experts": 2, "quantization_config": {**NV, "ignore": ["x*"] * 1_000_000}})),
        "the ignore list has 1000000 entries, over the 10000"),
}


@pytest.mark.parametrize("name", sorted(ROUND2_LINT_ERRORS))
def test_round2_a_hostile_checkpoint_is_exit_2_naming_the_file(name, tmp_path, capsys, no_hang):
    corrupt, message = ROUND2_LINT_ERRORS[name]
    d = _checkpoint(tmp_path / "ck")
    corrupt(d)
    rc, err = _run(capsys, "lint", str(d))
    assert rc == 2, err
    assert message in err and str(d) in err, err


E = "model.layers.0.mlp.experts.{}.down_proj.weight"
ROUND2_LINT_FINDINGS = {  # once silent OKs (exit 0): each is now a finding, (code, module, words of its message)
    "index-missing-shard": (lambda d: _index(d, {W0: "model.safetensors", W1: "model-2.safetensors"}),
                            ("missing_tensor", "model.safetensors.index.json", "names shard model-2.safetensors")),
    "index-leaves-a-shard-out": (lambda d: _index(d, {W0: "model.safetensors", W1: "model.safetensors"}) or save_file(
        {"lm_head.weight": np.zeros((2, 2), np.float32)}, str(d / "extra.safetensors")),
        ("unexpected_tensor", "model.safetensors.index.json", "leaves out extra.safetensors")),
    "index-maps-to-the-wrong-shard": (lambda d: (_index(d, {W0: "model.safetensors", W1: "model.safetensors",
                                                            "lm_head.weight": "model.safetensors"})),
                                      ("missing_tensor", "lm_head", "maps it to model.safetensors, which does not")),
    "arabic-digit-expert": (_rename(W1, E.format("\u0661")), ("unexpected_tensor", E.format("\u0661")[:-7],
                                                              "is not how vLLM names an expert")),
    "leading-zero-expert": (_rename(W1, E.format("01")), ("unexpected_tensor", E.format("01")[:-7],
                                                          "is not how vLLM names an expert")),
    "more-experts-than-the-config": (lambda d: (d / "config.json").write_text('{"num_experts": 1}'),
                                     ("unexpected_tensor", "model.layers.0.mlp.experts.1", "config.json says 1")),
    "half-size-experts": (lambda d: (d / "config.json").write_text(json.dumps(
        {"num_experts": 2, "hidden_size": 4, "moe_intermediate_size": 8})),
        ("bad_shape", "model.layers.0.mlp.experts.0.down_proj", "config.json sizes make down_proj 4 x 8")),
}


@pytest.mark.parametrize("name", sorted(ROUND2_LINT_FINDINGS))
def test_round2_a_once_silent_corrupt_checkpoint_is_a_named_finding(name, tmp_path, capsys, no_hang):
    corrupt, (code, module, words) = ROUND2_LINT_FINDINGS[name]
    d = _checkpoint(tmp_path / "ck")
    corrupt(d)
    rc = cli.main(["lint", str(d), "--json"])
    found = json.loads(capsys.readouterr().out)["findings"]
    assert rc == 1 and any(f["code"] == code and f["module"] == module and words in f["message"] for f in found), \
        found


@pytest.mark.parametrize("dtype, shape, nbytes", [("C64", [2], 16), ("F6_E2M3", [16], 12), ("F6_E3M2", [4], 3),
                                                  ("F8_E8M0", [3], 3), ("F4", [4], 2), ("F8_E5M2", [1], 1)])
def test_round2_every_dtype_the_installed_safetensors_reads_passes(dtype, shape, nbytes, tmp_path, capsys):
    """Asked of the library (untrusted.known_dtype), not a list: C64 and F6_E2M3 were once "not a safetensors
    dtype"."""
    d = _checkpoint(tmp_path / "ck")
    save_file({W0: np.zeros((4, 4), np.float32), W1: np.zeros((4, 4), np.float32),
               "lm_head.extra": np.zeros(nbytes, np.uint8)}, str(d / "model.safetensors"))
    _rewrite_header(d, lambda h: h | {"lm_head.extra": h["lm_head.extra"] | {"dtype": dtype, "shape": shape}})
    rc, err = _run(capsys, "lint", str(d))
    assert rc == 0, err


def test_round2_names_from_a_checkpoint_cannot_forge_a_line_or_fail_to_print(tmp_path, capsys):
    """A tensor name holding an escape sequence, a newline and a forged verdict; an ignore entry holding a lone
    surrogate: printed escaped, one finding a line, and no "OK:" line in a failing report."""
    d = _checkpoint(tmp_path / "ck", {"num_experts": 2, "quantization_config": {**NV, "ignore": ["lm_\ud800"]}})
    forged = "x\x1b[2J\nOK: every tensor agrees with the declared scheme"
    save_file({W0: np.zeros((4, 4), np.float32), W1: np.zeros((4, 4), np.float32),
               forged + ".weight": np.zeros((4, 4), np.uint8)}, str(d / "model.safetensors"))
    assert cli.main(["lint", str(d)]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\ud800" not in out and "lm_\\ud800" in out
    assert not any(line.startswith("OK:") for line in out.splitlines())
    assert "x\\x1b[2J\\x0aOK: every tensor agrees" in out


@pytest.mark.parametrize("pattern", ["(a+)+$", "(.|.)*Z", ".*" * 60 + "Z", "(x+x+)+y"])
def test_round2_an_ignore_pattern_cannot_hang(pattern, tmp_path, capsys, no_hang):
    """Once only a repeat nested in a repeat was refused; RE2 matches any pattern in linear time, so each of these
    lints a checkpoint of long module names in well under the alarm."""
    d = _checkpoint(tmp_path / "ck", {"num_experts": 2, "quantization_config": {**NV, "ignore": ["re:" + pattern]}})
    long = "model." + "a" * 20_000 + "!"
    save_file({W0: np.zeros((4, 4), np.float32), W1: np.zeros((4, 4), np.float32),
               long + ".weight": np.zeros((4, 4), np.float32)}, str(d / "model.safetensors"))
    start = time.perf_counter()
    rc, err = _run(capsys, "lint", str(d))
    assert rc == 1 and time.perf_counter() - start < 10, err


# --------------------------------------------------------------------------------- round 2: reports


def _night(tmp_path: Path, capsys) -> tuple[Path, dict]:
    f = tmp_path / "j.xml"
    f.write_text(JUNIT.format(body="", name="t", time="1"))
    _run(capsys, "report", str(f), "--out", str(tmp_path / "n1"), "--night", "n1")
    return f, json.loads((tmp_path / "n1" / "summary.json").read_text())


@pytest.mark.parametrize("edit, message", [
    (lambda s: s | {"inputs": [i | {"common": i["common"] | {"vllm_version": 5}} for i in s["inputs"]]},
     "has malformed common or properties"),
    (lambda s: s | {"cases": {k: v | {"history": "failed\tpassed\tfailed"} for k, v in s["cases"].items()}},
     "has 3 nights of history, the summary names 0"),
    (lambda s: "[" * 100_000 + "]" * 100_000, "previous summary is not valid JSON: maximum recursion depth"),
])
def test_round2_a_previous_summary_of_the_wrong_types_is_exit_2(edit, message, tmp_path, capsys, no_hang):
    f, summary = _night(tmp_path, capsys)
    prev = tmp_path / "prev.json"
    edited = edit(summary)
    prev.write_text(edited if isinstance(edited, str) else json.dumps(edited))
    rc, err = _run(capsys, "report", str(f), "--out", str(tmp_path / "n2"), "--previous", str(prev))
    assert rc == 2 and str(prev) in err and message in err, err


def test_round2_a_previous_summary_that_is_a_fifo_is_refused_without_waiting(tmp_path, capsys, no_hang):
    f, _ = _night(tmp_path, capsys)
    prev = _fifo(tmp_path / "prev.json")
    rc, err = _run(capsys, "report", str(f), "--out", str(tmp_path / "n2"), "--previous", str(prev))
    assert rc == 2 and "cannot read previous summary: not a regular file (a FIFO)" in err, err


def test_round2_recorded_tokens_nested_deep_or_huge_read_as_absent(tmp_path, capsys):
    props = ('<properties><property name="greedy_token_ids" value="' + "[" * 5000 + "]" * 5000 + '"/>'
             '<property name="greedy_top_k" value="{&quot;k&quot;:1,&quot;ranked&quot;:[[[' + "9" * 5000 + ']]]}"/>'
             '</properties>')
    f = tmp_path / "j.xml"
    f.write_text(JUNIT.format(body="", name="t", time="1").replace('<failure message="m"/>', props + "<failure/>"))
    rc, err = _run(capsys, "report", str(f), "--out", str(tmp_path / "out"))
    assert rc == 1, err


def test_round2_a_run_directory_of_odd_entries_names_each_and_reads_the_rest(tmp_path, capsys, no_hang):
    """A FIFO named *.xml, a file name that is not UTF-8 and a directory nested 1,200 levels: each a named bad
    input (exit 2), the readable file still merged; never a hang, a RecursionError or a UnicodeEncodeError."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "a.xml").write_text(JUNIT.format(body="", name="t", time="1"))
    _fifo(run / "b.xml")
    with open(os.path.join(os.fsencode(run), b"\xff.xml"), "w") as f:
        f.write(JUNIT.format(body="", name="u", time="1"))
    deep = run
    for _ in range(1200):
        deep = deep / "d"
        deep.mkdir()
    try:
        rc, err = _run(capsys, "report", str(run), "--out", str(tmp_path / "out"))
    finally:  # bottom up: shutil.rmtree (pytest's own tmp cleanup too) recurses once per level
        while deep != run:
            deep.rmdir()
            deep = deep.parent
    assert rc == 2, err
    assert "b.xml: cannot read: not a regular file (a FIFO)" in err
    assert "\\udcff.xml: the file name is not UTF-8" in err
    assert "nested deeper than 64 levels below the run directory" in err
    assert list(json.loads((tmp_path / "out" / "summary.json").read_text())["cases"]) == ["c::t"]


def test_round2_an_unusable_out_is_one_line_from_the_forked_writer(tmp_path, capfd):
    """The forked child writes to the real stderr (capfd): one line naming what it could not write, no traceback."""
    f = tmp_path / "j.xml"
    f.write_text(JUNIT.format(body="", name="t", time="1"))
    (tmp_path / "out" / "summary.json").mkdir(parents=True)
    rc = cli.main(["report", str(f), "--out", str(tmp_path / "out"), "--jobs", "2"])
    err = capfd.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert "writing summary.json and matrix.md: [Errno 21] Is a directory" in err
