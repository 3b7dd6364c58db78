"""docs/matrix.md's data tables are generated (report.doc_tables): these fail when the file says something the
package data no longer does, and pin how a read-set is matched to its scheme family."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from quantmatrix import cli
from quantmatrix.adapter import families
from quantmatrix.errors import AdapterMismatch, QuantmatrixError
from quantmatrix.report import doc_tables
from quantmatrix.schema.load import load
from quantmatrix.schema.model import MoeBackend

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "matrix.md"


@pytest.fixture(scope="module")
def default():
    return load(ROOT / "matrices" / "default.yaml")


def test_docs_matrix_md_is_generated_from_the_data(default):
    """Regenerate every marked table and compare: a new scheme, producer, arch or read-set must reach the docs."""
    text = DOC.read_text(encoding="utf-8")
    assert doc_tables.render(text, doc_tables.tables(default), str(DOC)) == text, (
        "docs/matrix.md is out of date with the package data: run `quantmatrix docs` and commit the result")


def test_the_dispatch_table_names_every_scheme_producer_and_read_set(default):
    """Each (scheme, producer) of the matrix has a row, and FP8 static / dynamic rows list their own read-sets."""
    table = doc_tables.dispatch(default)
    for ck in default.checkpoints:
        assert f"| `{ck.scheme.name}` | `{ck.producer}` |" in table
    static = next(r for r in table.splitlines() if r.startswith("| `fp8_static` | `modelopt` |"))
    dynamic = next(r for r in table.splitlines() if r.startswith("| `fp8_dynamic` |"))
    assert "`FP8_TRITON`: weight, block_scale, input_scale" in static and "FP8_DYNAMIC_" not in static
    assert "`FP8_DYNAMIC_CPU`: weight, block_scale" in dynamic and "`FP8_TRITON`" not in dynamic
    wo = next(r for r in table.splitlines() if r.startswith("| `nvfp4_weight_only` | `modelopt` | `modelopt_fp4`"))
    assert "`MARLIN`" in wo and "VLLM_CUTLASS" not in wo and "FP8_" not in wo  # not_read: no W4A4 kernel


def test_a_pinned_backend_and_a_matrix_read_set_reach_the_table(default):
    """`moe_backend` per arch narrows the row to the pin; a matrix's own moe_backends entry is listed."""
    scheme = default.schemes["fp8_dynamic"]
    pinned = dataclasses.replace(scheme, expect={**scheme.expect, "moe_backend": {"FP8_DYNAMIC_DEEPGEMM"}})
    extra = MoeBackend("FP8_DYNAMIC_NEW", frozenset({"weight", "block_scale"}), False, "new")
    cks = tuple(dataclasses.replace(c, scheme=pinned) if c.scheme.name == "fp8_dynamic" else c
                for c in default.checkpoints)
    row = next(r for r in doc_tables.dispatch(dataclasses.replace(default, checkpoints=cks)).splitlines()
               if r.startswith("| `fp8_dynamic` |"))
    assert "`FP8_DYNAMIC_DEEPGEMM`" in row and "TRITON" not in row
    row = next(r for r in doc_tables.dispatch(dataclasses.replace(default, moe_backends={"FP8_DYNAMIC_NEW": extra}))
               .splitlines() if r.startswith("| `fp8_dynamic` |"))
    assert "`FP8_DYNAMIC_NEW`: weight, block_scale" in row


def test_read_sets_take_the_longest_prefix_so_a_new_family_is_data(monkeypatch):
    """A new scheme family (WNA16) is one READ_SET_PREFIX row: its read-sets leave NVFP4's, FP8's stay apart."""
    names = ["MARLIN", "FP8_MARLIN", "FP8_DYNAMIC_MARLIN", "WNA16_MARLIN"]
    monkeypatch.setitem(families.READ_SET_PREFIX, "wna16", "WNA16_")
    assert families.read_sets("wna16", names) == ["WNA16_MARLIN"]
    assert families.read_sets("weight_only", names) == ["MARLIN"]
    assert families.read_sets("fp8_static", names) == ["FP8_MARLIN"]
    assert families.read_sets("fp8_block", names) == ["FP8_DYNAMIC_MARLIN"]
    assert families.read_sets("unquantized", names) is None
    with pytest.raises(AdapterMismatch, match="READ_SET_PREFIX"):
        families.read_sets("int8", names)


def test_render_refuses_a_file_without_its_markers():
    with pytest.raises(QuantmatrixError, match="needs one line"):
        doc_tables.render("no markers here\n", {"x": lambda: "| a |"}, "doc.md")
    begin, end = doc_tables.BEGIN.format(name="x"), doc_tables.END.format(name="x")
    fresh = doc_tables.render(f"a\n{begin}\nstale\n{end}\nb\n", {"x": lambda: "new"}, "d")
    assert fresh == f"a\n{begin}\nnew\n{end}\nb\n"


def test_cli_docs_check_says_the_docs_are_current(capsys):
    assert cli.main(["docs", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_wna16_rows_name_their_own_read_sets_and_none_where_no_layer_check_selects_them(default):
    """WNA16 resolves to weight_only as NVFP4 does: the table must list the WNA16_* read-sets, never NVFP4's; and a
    checkpoint layer_dispatch has no case of (vLLM cannot build its layer) expects none."""
    table = doc_tables.dispatch(default).splitlines()
    rows = [r for r in table if r.startswith("| `wna16_int4_g32` | `gptq`")]
    assert rows and all("`WNA16_TRITON`: weight, block_scale, zero_point" in r and "`MARLIN`" not in r for r in rows)
    rows = [r for r in table if r.startswith("| `wna16_int4_channel` | `gptq`")]
    assert rows and all("layer_dispatch does not select it" in r and "WNA16_" not in r for r in rows), rows
