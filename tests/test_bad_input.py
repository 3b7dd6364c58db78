"""Every bad input issue 14 found, as its minimal case, through the command a user runs: a clear message naming the
file (and line:column or tensor) with exit 2, findings 1, success 0, a bug 3 with a log; never a traceback."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from quantmatrix import cli
from quantmatrix.checkpoints import store
from quantmatrix.report import render_md

ROOT = Path(__file__).resolve().parents[1]
BASE = (ROOT / "matrices" / "default.yaml").read_text(encoding="utf-8")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = cli.main(list(argv))
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    return rc, cap.err


@pytest.fixture
def matrices(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "matrices", tmp_path / "matrices")
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
