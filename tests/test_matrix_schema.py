"""Every schema rule gets one bad file; each error names file:line:column and says what was expected."""

from __future__ import annotations

import re

import pytest
from matrixkit import SMALL, write

from quantmatrix.errors import MatrixError
from quantmatrix.schema.load import load


def _replace(old: str, new: str) -> str:
    assert old in SMALL, old
    return SMALL.replace(old, new, 1)


BAD = [
    # (id, text, line, fragment)
    ("not-yaml", "version: 1\narchs: [\n", 3, "not valid YAML"),
    ("empty", "", 1, "the matrix file is empty"),
    ("top-level-typo", _replace("checkpoints:", "checkpionts:"), 19,
     "unknown key 'checkpionts' (did you mean 'checkpoints'?)"),
    ("missing-required", _replace("version: 1\n", ""), 1, "missing required key 'version'"),
    ("wrong-type", _replace("engine_args: {enforce_eager: true}", "engine_args: [enforce_eager]"), 10,
     "modes[1].engine_args: expected a mapping, got a list"),
    ("duplicate-key", _replace("  - {name: default, label: cudagraphs}",
                               "  - {name: default, label: cudagraphs, label: again}"), 7,
     "duplicate key 'label'"),
    ("duplicate-checkpoint-id", _replace("  - id: tiny-w4a4", "  - id: tiny-wo"), 24,
     "duplicate checkpoint id 'tiny-wo' (already defined at"),
    ("duplicate-alias", _replace("aliases: [b200]", "aliases: [gb10]"), 5, "duplicate arch name or alias 'gb10'"),
    ("dangling-scheme", _replace("scheme: nvfp4_w4a4", "scheme: nvfp4_w4a8"), 27,
     "unknown scheme 'nvfp4_w4a8' (did you mean 'nvfp4_w4a4'?)"),
    ("dangling-check-scheme", _replace("schemes: [nvfp4_weight_only]", "schemes: [nvfp4_weightonly]"), 18,
     "unknown scheme 'nvfp4_weightonly' (did you mean 'nvfp4_weight_only'?)"),
    ("dangling-selector", SMALL + "exclude:\n  - {arch: sm12O}\n", 29, "no arch named 'sm12O' (did you mean"),
    ("float-capability", _replace('capability: "12.1"', "capability: 12.1"), 5, "write the capability as a string"),
    ("duplicate-capability", _replace('capability: "12.1"', 'capability: "12.0"'), 5,
     "capability (12, 0) already used by 'sm120'"),
    ("reserved-marker", _replace("{name: default,", "{name: skip,"), 7, "'skip' is reserved by pytest"),
    ("marker-clash", _replace("aliases: [b200]", "aliases: [nocache]"), 8,
     "marker 'nocache' is used both as arch and as mode"),
    ("env-not-string", _replace('PYTORCH_NO_CUDA_MEMORY_CACHING: "1"', "PYTORCH_NO_CUDA_MEMORY_CACHING: true"),
     9, "environment values are strings"),
    ("trust-remote-code", _replace("engine_args: {enforce_eager: true}",
                                   "engine_args: {enforce_eager: true, trust_remote_code: true}"), 10,
     "modes[1].engine_args.trust_remote_code: a matrix is data, and this runs the checkpoint's own Python in the "
     "engine (--trust-matrix allows it)"),
    ("path-outside-repository", _replace("source: {synthetic: {model: qwen3_moe}}", "source: {path: ../elsewhere}"),
     21, "checkpoints[0].source.path: '../elsewhere' is "),
    ("env-ld-preload", _replace('PYTORCH_NO_CUDA_MEMORY_CACHING: "1"', "LD_PRELOAD: /tmp/x.so"), 9,
     "modes[1].env: 'LD_PRELOAD' is not a variable a matrix may set for the engine (only CUDA_*, PYTORCH_*, TORCH_*, "
     "VLLM_*, QUANTMATRIX_*, NCCL_*: a matrix is data, not code)"),
    ("env-pythonpath", _replace('PYTORCH_NO_CUDA_MEMORY_CACHING: "1"', "PYTHONPATH: /tmp"), 9,
     "'PYTHONPATH' is not a variable a matrix may set for the engine"),
    ("bad-choice", _replace("tier: cpu", "tier: cuda"), 17, "expected one of cpu, gpu; got 'cuda'"),
    ("unsafe-tag-sequence", _replace("label: B200}", "label: !!python/object/apply:os.system [id]}"), 3,
     "archs[0].label: expected a single value, got a list"),
    ("unsafe-tag-scalar", _replace("label: B200}", "label: !!python/name:os.system ''}"), 3,
     "could not determine a constructor for the tag 'tag:yaml.org,2002:python/name:os.system'"),
    ("two-sources", _replace("source: {synthetic: {model: qwen3_moe}}\n    producer: modelopt\n    scheme: nvfp4_w4a4",
                             "source: {synthetic: {model: qwen3_moe}, path: /x}\n    producer: modelopt\n"
                             "    scheme: nvfp4_w4a4"), 25, "expected exactly one of synthetic, path, hub"),
    ("synthetic-typo", _replace("source: {synthetic: {model: qwen3_moe}}", "source: {synthetic: {modle: qwen3_moe}}"),
     21, "unknown key 'modle' (did you mean 'model'?)"),
    ("impossible-synthetic", _replace("source: {synthetic: {model: qwen3_moe}}\n    producer: modelopt\n    scheme: "
                                      "nvfp4_w4a4", "source: {synthetic: {form: legacy}}\n    producer: "
                                      "compressed-tensors\n    scheme: nvfp4_w4a4"), 25,
     "form 'legacy' (hf_quant_config.json) exists only for producer modelopt"),
    ("bad-expectation", _replace("expect: {resolves_to: w4a4}", "expect: {resolves_to: w4a16}"), 15,
     "expected one of weight_only, w4a4, fp8_static, fp8_dynamic, fp8_block, w8a8_int8, w4a8_fp8, mxfp4, "
     "mxfp8, unquantized, rejected; got 'w4a16'"),
    ("waiver-bad-date", SMALL + "waivers:\n  - match: {arch: gb10}\n    reason: r\n    link: l\n"
     "    expires: next week\n", 32, "expected a date YYYY-MM-DD"),
    ("waiver-dangling-checkpoint", SMALL + "waivers:\n  - match: {checkpoint: tiny-w0}\n    reason: r\n    link: l\n"
     "    expires: 2030-01-01\n", 29, "no checkpoint named 'tiny-w0' (did you mean 'tiny-wo'?)"),
    ("bad-id", _replace("id: tiny-wo", "id: Tiny WO"), 20, "'Tiny WO' is not an id"),
    # a cpu cell's host needs: a closed vocabulary, on cpu_cells only, never an empty list
    ("unknown-host-need", _replace("description: needs the arch}", "cpu_cells: [{arch: sm121, needs: [zentorch]}], "
                                   "description: needs the arch}"), 18,
     "checks[1].cpu_cells[0].needs[0]: expected one of zen_cpu, amx; got 'zentorch'"),
    ("empty-host-needs", _replace("description: needs the arch}", "cpu_cells: [{arch: sm121, needs: []}], "
                                  "description: needs the arch}"), 18,
     "checks[1].cpu_cells[0].needs: an empty list needs nothing; leave the key out"),
    ("host-needs-outside-cpu-cells", _replace("description: needs the arch}", "cells: [{arch: sm121, needs: [amx]}], "
                                              "description: needs the arch}"), 18,
     "checks[1].cells[0]: unknown key 'needs'"),
]


@pytest.mark.parametrize(("text", "line", "fragment"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_matrix_names_file_line_and_problem(tmp_path, text, line, fragment):
    """A malformed matrix raises MatrixError (never a traceback from yaml or a KeyError) at the right line."""
    path = write(tmp_path, text)
    with pytest.raises(MatrixError) as info:
        load(path)
    message = str(info.value)
    assert re.match(rf"{re.escape(str(path))}:{line}:\d+: ", message), message
    assert fragment in message, message


def test_small_matrix_is_valid(tmp_path):
    """The base of the bad files above is itself valid, so each bad file tests exactly one rule."""
    m = load(write(tmp_path))
    assert [a.name for a in m.archs] == ["sm100", "sm120", "sm121"]
    assert m.modes[1].env == {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    assert m.modes[1].engine_args == {"enforce_eager": True}


def test_missing_file_is_a_matrix_error(tmp_path):
    """A matrix path that does not exist says so, with the path."""
    with pytest.raises(MatrixError, match="cannot read matrix"):
        load(tmp_path / "nope.yaml")


def test_default_matrix_loads():
    """The shipped default matrix is valid and covers every producer, every scheme and the three base modes."""
    from pathlib import Path

    m = load(Path(__file__).parent.parent / "matrices" / "default.yaml")
    assert {c.producer for c in m.checkpoints} == {"modelopt", "compressed-tensors", "fp8", "gptq", "awq", "mxfp4",
                                                   "none"}
    assert {c.scheme.name for c in m.checkpoints} == {"bf16", "nvfp4_weight_only", "nvfp4_w4a4", "fp8_static",
                                                      "fp8_dynamic", "fp8_block", "mxfp4", "mxfp8", *(
        f"wna16_{v}" for v in ("int4_g32", "int4_g32_actorder", "int4_channel", "int8_g32", "int8_channel",
                               "int4_g48", "int4_g64")), "mixed_nvfp4_fp8", "mixed_nvfp4_fp8_unmapped",
                                                      "mixed_nvfp4_fp8_unlisted", "w8a8_int8", "w4a8_fp8_g128",
                                                      "w4a8_fp8_g64"}
    assert {"default", "eager", "nocache"} <= {md.name for md in m.modes}
    assert {a.name for a in m.archs} >= {"sm100", "sm120", "sm121"}


@pytest.mark.parametrize("layouts, message", [
    ("layouts:\n  - {tp: 1, ep: true}\n", r"m.yaml:\d+:\d+: layouts\[0\].ep: expert parallel needs at least 2 ranks"),
    ("layouts:\n  - {tp: 2}\n  - {tp: 2, ep: false}\n", r"m.yaml:\d+:\d+: duplicate layout 'tp2' \(already defined "
                                                          r"at .*m.yaml:\d+:\d+\)"),
    ("layouts:\n  - {tp: 0}\n", r"m.yaml:\d+:\d+: layouts\[0\].tp"),
    ("layouts:\n  - {tp: 2, cells: [{layout: tp4}]}\n", r"layouts\[0\].cells\[0\].layout: no layout named 'tp4' "
                                                         r"\(did you mean 'tp2'"),
    ("layouts:\n  - {tp: 2, tp_size: 2}\n", r"layouts\[0\]: unknown key 'tp_size'"),
])
def test_bad_layouts_are_refused_with_their_line(tmp_path, layouts, message):
    with pytest.raises(MatrixError, match=message):
        load(write(tmp_path, SMALL + layouts))


def test_a_layout_marker_may_not_mean_a_mode_too(tmp_path):
    text = SMALL.replace("  - {name: default, label: cudagraphs}", "  - {name: default, label: cudagraphs}\n"
                         "  - {name: tp2, label: a mode that took a layout's name}")
    with pytest.raises(MatrixError, match=r"marker 'tp2' is used both as mode and as layout"):
        load(write(tmp_path, text + "layouts:\n  - {tp: 2}\n"))


def test_trust_matrix_lets_a_matrix_run_remote_code_and_name_files_outside_its_repository(tmp_path):
    """What --trust-matrix allows; without it, a symlink out of the repository is outside it too, while a file
    elsewhere in the matrix's git repository (above the matrix's own directory) is inside."""
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    (repo / ".git").mkdir(parents=True)
    (repo / "matrices").mkdir()
    outside.mkdir()
    (repo / "ck").mkdir()
    (repo / "matrices" / "link").symlink_to(outside)
    inside = write(repo / "matrices", _replace("source: {synthetic: {model: qwen3_moe}}", "source: {path: ../ck}"))
    assert load(inside).checkpoints[0].source.value == repo / "ck"
    linked = write(repo / "matrices", _replace("source: {synthetic: {model: qwen3_moe}}", "source: {path: link}"))
    with pytest.raises(MatrixError, match=rf"m.yaml:21:\d+: .*is {re.escape(str(outside))}, outside the matrix's "
                                          rf"repository {re.escape(str(repo))}"):
        load(linked)
    assert load(linked, trusted=True).checkpoints[0].source.value == outside
    remote = write(tmp_path, _replace("engine_args: {enforce_eager: true}", "engine_args: {trust_remote_code: true}"))
    assert load(remote, trusted=True).modes[1].engine_args == {"trust_remote_code": True}
