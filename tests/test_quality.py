"""The quality oracles on data: the seed bug's output trips degeneration, the tiny model's ordinary output does
not; agreement follows check_logprobs_close; Wilson bounds; references are keyed, required and atomic."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest

from quantmatrix import properties as P
from quantmatrix.checks import quality
from quantmatrix.engine import references
from quantmatrix.measure import hf
from quantmatrix.report import render_md
from quantmatrix.report.build import build
from quantmatrix.report.model import grid
from quantmatrix.schema.load import load
from quantmatrix.schema.model import Cell

ROOT = Path(__file__).resolve().parent.parent
MATRIX = load(ROOT / "matrices" / "default.yaml")
BF16 = next(c for c in MATRIX.checkpoints if c.id == "qwen3moe-tiny-bf16")
LIMITS = BF16.expectation("degeneration")
REFERENCE = json.loads((ROOT / "references" / BF16.id / "bf16" / "default" / "outputs.json").read_text())


def _cell(mode: str = "default") -> Cell:
    return Cell(BF16, MATRIX.archs[0], MATRIX.mode(mode))


def _out(tokens: list[int], top: list[dict[int, float]] | None = None) -> dict:
    top = top or [{t: -1.0} for t in tokens]
    return {"prompt_token_ids": [1], "token_ids": tokens, "logprobs": [{str(k): v for k, v in d.items()}
                                                                        for d in top]}


def test_seed_failure_trips_every_degeneration_threshold():
    """The seed bug's output (one token repeated, on every prompt) crosses all four thresholds of the matrix."""
    seed = [[318] * 32 for _ in range(8)]
    crossed = quality.degeneration(seed).crossed(LIMITS)
    assert len(crossed) == 4, crossed


def test_a_two_token_loop_is_degenerate_too():
    """A loop that never repeats one token twice in a row is still caught (distinct-n, compression)."""
    crossed = quality.degeneration([[5, 9] * 16 for _ in range(8)]).crossed(LIMITS)
    assert any("distinct-1" in c for c in crossed) and any("compression" in c for c in crossed)
    assert not any("repeated" in c for c in crossed)


def test_ordinary_output_of_the_tiny_model_is_not_degenerate():
    """The transformers reference of the bf16 checkpoint (with its 13-token run on prompt 2) passes."""
    metrics = quality.degeneration([o["token_ids"] for o in REFERENCE["outputs"]])
    assert metrics.crossed(LIMITS) == [], metrics.summary()
    assert metrics.max_repeat_run > 1  # the data really contains a run: the threshold is what lets it pass


@pytest.mark.parametrize(("tokens", "run"), [([], 0), ([1], 1), ([1, 2, 2, 2, 3, 3], 3), ([4, 4, 4, 4], 4)])
def test_longest_run(tokens, run):
    """The longest run counts consecutive equal tokens only."""
    assert quality.longest_run(tokens) == run


def test_first_divergence_within_top_k_is_a_near_tie():
    """Tokens that part at a position where each is in the other's top-k are accepted, and the position is
    reported; after it nothing is compared."""
    ours = _out([1, 2, 9, 7], [{1: -1}, {2: -1}, {3: -1.1, 9: -1.0}, {7: -1}])
    theirs = _out([1, 2, 3, 8], [{1: -1}, {2: -1}, {3: -1.0, 9: -1.2}, {8: -1}])
    d = quality.first_divergence(0, ours, theirs, k=2)
    assert (d.position, d.token, d.other, d.within_top_k) == (2, 9, 3, True)


def test_first_divergence_outside_top_k_fails():
    """A token the other run did not rank within its top-k is a real disagreement."""
    ours = _out([1, 5], [{1: -1}, {5: -0.5, 3: -3.0}])
    theirs = _out([1, 3], [{1: -1}, {3: -0.1, 4: -2.0}])
    assert not quality.first_divergence(0, ours, theirs, k=2).within_top_k


def test_a_nan_logprob_is_never_within_top_k():
    """NaN logprobs (stored as null) never rank, so a NaN-producing engine cannot pass as a near-tie."""
    assert quality.top_k({"4": None, "5": -3.0}, 2) == [5]


def test_exact_comparison_fails_on_any_difference():
    """invariance_top_k 0: a single changed token is a failure, even a near-tie."""
    a = _out([1, 2], [{1: -1}, {2: -1.0, 3: -1.0}])
    b = _out([1, 3], [{1: -1}, {3: -1.0, 2: -1.0}])
    assert [d.within_top_k for d in quality.exact([a], [b])] == [False]
    assert [d.within_top_k for d in quality.exact([a], [a])] == [True]


def test_prompt_mismatch_is_named():
    """Two runs on different prompt tokens are not compared; the message names the prompt."""
    a, b = _out([1]), {**_out([1]), "prompt_token_ids": [2]}
    assert "prompt 0" in quality.prompt_mismatch([a], [b])


@pytest.mark.parametrize(("correct", "n", "low", "high"), [(5, 10, 0.2366, 0.7634), (0, 10, 0.0, 0.2775),
                                                           (10, 10, 0.7225, 1.0)])
def test_wilson_interval(correct, n, low, high):
    """Wilson score interval at z = 1.96 (textbook values)."""
    lo, hi = quality.wilson_interval(correct, n, 1.96)
    assert (round(lo, 4), round(hi, 4)) == (low, high)


def test_accuracy_passes_down_to_the_reference_lower_bound_and_not_below():
    """Pass line = Wilson lower bound of the reference accuracy minus max_drop; the arithmetic is shown."""
    bound = quality.wilson_interval(36, 40, 1.96)[0]  # 0.7695
    ok = quality.AccuracyVerdict(31, 40, 36, 40, 1.96, 0.0)
    bad = quality.AccuracyVerdict(30, 40, 36, 40, 1.96, 0.0)
    assert ok.accuracy >= bound > bad.accuracy
    assert ok.ok and not bad.ok
    assert "pass line" in bad.arithmetic() and "36/40" in bad.arithmetic()


def test_score_reads_the_first_non_blank_line():
    """An answer counts when the continuation's first non-blank line starts with it."""
    assert quality.score(["\n 42 is it", "4\n42", ""], ["42", "42", "42"]) == [True, False, False]


def test_a_missing_reference_is_an_error_that_says_how_to_write_it(tmp_path):
    """No reference file: ReferenceMissing naming checkpoint, scheme, mode and --update-references."""
    with pytest.raises(references.ReferenceMissing, match=r"scheme bf16, mode default.*--update-references"):
        references.load(tmp_path, _cell(), "outputs")


def test_references_are_keyed_by_checkpoint_scheme_and_mode(tmp_path):
    """A written reference is found under its own key only; a file moved to another mode's key is refused."""
    p = references.write(tmp_path, _cell(), "outputs", {"outputs": []}, {"source": "test"})
    assert p == tmp_path / BF16.id / "bf16" / "default" / "outputs.json"
    assert references.load(tmp_path, _cell(), "outputs")["produced_by"]["source"] == "test"
    moved = references.path(tmp_path, _cell("poison_nan"), "outputs")
    moved.parent.mkdir(parents=True)
    moved.write_text(p.read_text())
    with pytest.raises(references.ReferenceMissing, match="keyed"):
        references.load(tmp_path, _cell("poison_nan"), "outputs")
    assert not list(p.parent.glob(".*.tmp"))  # written through a temp file, nothing left behind


def test_an_engine_reference_is_kept_per_arch_family_and_every_new_reference_is_unreviewed(tmp_path):
    """A transformers reference is one file for every arch; an engine reference (real.yaml) carries its arch
    family: sm120 and sm121 share sm12x's file, sm100 writes its own. Each file written is unreviewed until a
    person sets `reviewed` true; the committed files, from before the field, count as reviewed."""
    real = load(ROOT / "matrices" / "real.yaml")
    engine = next(c for c in real.checkpoints if c.expectation("reference", default=None) == "engine")
    arch = {a.name: a for a in real.archs}
    cells = {name: Cell(engine, arch[name], real.modes[0]) for name in ("sm120", "sm121", "sm100")}
    where = {name: references.path(tmp_path, cell, "outputs") for name, cell in cells.items()}
    assert where["sm120"] == where["sm121"] == where["sm120"].parent.parent / "sm12x" / "outputs.json"
    assert where["sm100"].parent.name == "sm10x"
    assert references.path(tmp_path, Cell(BF16, MATRIX.archs[0], MATRIX.mode("default")), "outputs") == \
        tmp_path / BF16.id / "bf16" / "default" / "outputs.json"
    written = references.write(tmp_path, cells["sm121"], "outputs", {"outputs": []}, {"source": "engine"})
    assert written == where["sm121"] and not references.reviewed(references.load(tmp_path, cells["sm120"], "outputs"))
    assert references.reviewed(REFERENCE) and "reviewed" not in REFERENCE


def test_the_report_lists_the_cases_compared_with_an_unreviewed_reference(tmp_path):
    """The first night of a new reference: its cases still pass or fail against it, and matrix.md lists each
    with the file a person has yet to accept."""
    cell = "qwen36-35b-a3b-nvfp4-weight-only@sm121-default"
    ref = "references/qwen36/nvfp4/default/sm12x/outputs.json"
    props = {P.CHECKPOINT: cell.split("@")[0], P.ARCH: "sm121", P.MODE: "default", P.CHECK: "agreement",
             P.CELL: cell, P.UNREVIEWED_REFERENCE: ref}
    xml = "".join(f'<property name="{k}" value={quoteattr(v)}/>' for k, v in props.items())
    junit = tmp_path / "junit.xml"
    junit.write_text(f'<testsuites><testsuite name="s"><testcase classname="suites.test_e2e" '
                     f'name="test_agreement[{cell}]" time="1"><properties>{xml}</properties></testcase>'
                     "</testsuite></testsuites>")
    report = build([str(junit)], None, night="n1", date=datetime.date(2026, 12, 5))
    md = render_md.render(report, grid(report)).splitlines()
    at = md.index("## Compared with unreviewed references (docs/runners.md: First GPU references) (1)")
    assert md[at + 2] == f"- `suites.test_e2e::test_agreement[{cell}]` passed: `{ref}`"


def test_zeroed_experts_are_flagged_by_agreement_not_by_degeneration():
    """The seed's GB10 symptom on CPU: every expert weight zeroed. In this random tiny model attention alone
    still gives varied tokens (degeneration passes it, which is why the CPU canary uses NaN experts), but the
    agreement oracle flags it against the transformers reference of the intact model."""
    from quantmatrix.checkpoints.store import materialize_spec
    from quantmatrix.schema import synthetic as configs

    spec = configs.SyntheticSpec(producer="none", scheme="bf16", model="qwen3_moe",
                                 corrupt_tensors=(("model.layers.*.mlp.experts.*", "zero"),))
    zeroed = hf.transformers_greedy(materialize_spec(spec, "qwen3moe-tiny-bf16-experts-zero"),
                                            MATRIX.e2e.prompts, MATRIX.e2e.max_tokens, MATRIX.e2e.logprobs)
    assert quality.degeneration([o["token_ids"] for o in zeroed["outputs"]]).crossed(LIMITS) == []
    divs = quality.compare(zeroed["outputs"], REFERENCE["outputs"], BF16.expectation("agreement_top_k"))
    assert sum(not d.within_top_k for d in divs) >= len(divs) // 2, quality.describe(divs)
