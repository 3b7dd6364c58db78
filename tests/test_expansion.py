"""Cells are checkpoint x arch x mode, filtered by selectors; cases are checks applied to the cells they fit."""

from __future__ import annotations

import datetime

from matrixkit import SMALL, write

from quantmatrix.schema.load import load


def test_full_product_without_selectors(tmp_path):
    """2 checkpoints x 3 archs x 2 modes: 12 cells, ids checkpoint@arch-mode in matrix order."""
    m = load(write(tmp_path))
    ids = [c.id for c in m.cells()]
    assert len(ids) == 12 and ids[0] == "tiny-wo@sm100-default" and ids[-1] == "tiny-w4a4@sm121-nocache"
    assert [len(m.cases(c)) for c in m.checks.values()] == [12, 6]


def test_exclude_and_include_with_globs_and_aliases(tmp_path):
    """exclude drops matching cells; include keeps only matching ones; aliases match like names."""
    selectors = "include:\n  - {arch: [gb10, sm120]}\nexclude:\n  - {checkpoint: '*w4a4', mode: nocache}\n"
    m = load(write(tmp_path, SMALL + selectors))
    ids = {c.id for c in m.cells()}
    assert len(ids) == 2 * 2 * 2 - 2
    assert "tiny-w4a4@sm121-nocache" not in ids and "tiny-w4a4@sm121-default" in ids
    assert not any("sm100" in i for i in ids)


def test_case_markers_cover_every_axis(tmp_path):
    """A case carries its arch, aliases, scheme marker, mode, parallel layout, tier and check kind."""
    m = load(write(tmp_path))
    case = next(c for c in m.cases(m.checks["gpu_probe"]) if c.cell.id == "tiny-wo@sm121-nocache")
    assert case.markers == ("sm121", "gb10", "dgx_spark", "weight_only", "nocache", "tp1", "gpu", "e2e")


def test_waiver_with_check_key_matches_only_that_check(tmp_path):
    """A waiver naming a check waives that check's cases in the cell, not the cell's other checks."""
    text = SMALL + ("waivers:\n  - match: {arch: sm121, check: gpu_probe}\n    reason: r\n    link: l\n"
                    "    expires: 2099-01-01\n")
    m = load(write(tmp_path, text))
    gpu = [c for c in m.cases(m.checks["gpu_probe"]) if c.waiver]
    cpu = [c for c in m.cases(m.checks["cpu_probe"]) if c.waiver]
    assert {c.cell.id for c in gpu} == {"tiny-wo@sm121-default", "tiny-wo@sm121-nocache"} and cpu == []
    assert not gpu[0].waiver.expired(datetime.date(2098, 12, 31))
    assert gpu[0].waiver.expired(datetime.date(2099, 1, 2))


def test_expectations_fall_back_to_the_scheme_and_missing_ones_are_errors(tmp_path):
    """A checkpoint inherits its scheme's expectations; one nobody states is a matrix error, not a pass."""
    import pytest

    from quantmatrix.errors import MatrixError

    m = load(write(tmp_path))
    wo = m.checkpoints[0]
    assert wo.expectation("resolves_to") == "weight_only"
    with pytest.raises(MatrixError, match=r"m.yaml:\d+:\d+: checkpoint 'tiny-wo' states no expectation 'quant_method'"):
        wo.expectation("quant_method")


LAYOUTS = """\
layouts:
  - {tp: 2, except_cells: [{checkpoint: tiny-wo}, {mode: nocache}]}
  - {tp: 2, ep: true, cells: [{arch: gb10}]}
"""


def test_layouts_cross_the_cells_they_select_after_the_serving_ones(tmp_path):
    """Every checkpoint keeps its serving cells (ids unchanged); a declared layout adds the cells its selectors
    pick, with `-<layout>` at the end of the id, one layout after another; markers and selectors know them."""
    text = SMALL.replace("  - {name: cpu_probe, kind: dispatch, tier: cpu, description: runs anywhere}",
                         "  - {name: cpu_probe, kind: dispatch, tier: cpu, layouts: every, description: any}")
    m = load(write(tmp_path, text + LAYOUTS + "exclude:\n  - {layout: tp2_ep, checkpoint: tiny-wo, mode: nocache}\n"))
    ids = [c.id for c in m.cells()]
    assert ids[:12] == [c.id for c in load(write(tmp_path, SMALL, "plain.yaml")).cells()]
    assert ids[12:] == ["tiny-w4a4@sm100-default-tp2", "tiny-w4a4@sm120-default-tp2", "tiny-w4a4@sm121-default-tp2",
                        "tiny-wo@sm121-default-tp2_ep", "tiny-w4a4@sm121-default-tp2_ep",
                        "tiny-w4a4@sm121-nocache-tp2_ep"]
    assert {c.layout.name for c in m.cells()[:12]} == {"tp1"} and all(c.serving for c in m.cells()[:12])
    every, serving = m.cases(m.checks["cpu_probe"]), m.cases(m.checks["gpu_probe"])
    assert len(every) == 18 and len(serving) == 6 and all(c.cell.serving for c in serving)
    case = next(c for c in every if c.cell.id == "tiny-w4a4@sm121-nocache-tp2_ep")
    assert case.markers == ("sm121", "gb10", "dgx_spark", "w4a4", "nocache", "tp2_ep", "cpu", "dispatch")
    markers = m.markers()
    assert markers["tp2_ep"] == "quantmatrix parallel layout: 2 ranks, whole experts per rank (expert parallel)"
    assert markers["tp1"] == "quantmatrix parallel layout: one rank"


def test_a_checkpoint_is_served_in_the_layout_of_its_gpus(tmp_path):
    """`gpus: 2` serves tensor parallel over 2 ranks, with expert parallel when its engine_args enable it: that is
    its serving layout, so its ids carry no layout part and `layouts: serving` checks run there."""
    text = SMALL.replace("    scheme: nvfp4_w4a4\n", "    scheme: nvfp4_w4a4\n    gpus: 2\n"
                         "    engine_args: {enable_expert_parallel: true}\n")
    m = load(write(tmp_path, text + LAYOUTS))
    ck = next(c for c in m.checkpoints if c.id == "tiny-w4a4")
    assert (ck.serving.tp, ck.serving.ep, ck.serving.name) == (2, True, "tp2_ep")
    ids = [c.id for c in m.cells()]
    assert "tiny-w4a4@sm121-default" in ids and "tiny-w4a4@sm121-default-tp2_ep" not in ids
    assert "tiny-w4a4@sm121-default-tp2" in ids  # tp2 without ep is another layout for it
    served = [c for c in m.cells() if c.checkpoint.id == "tiny-w4a4" and c.serving]
    assert {c.layout.name for c in served} == {"tp2_ep"} and len(served) == 6
