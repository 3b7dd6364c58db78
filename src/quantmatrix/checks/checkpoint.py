"""The checkpoint checks (suites/test_checkpoints.py): the lint's findings against `expect.lint`, the bf16
model's greedy output in transformers, the dequantized model's logits against bf16; each verdict shows the
numbers that decided. What they judge is measured elsewhere (checkpoints.lint, measure.hf, measure.dequant)."""

from __future__ import annotations

from quantmatrix import properties as P
from quantmatrix.checkpoints.lint import LintReport
from quantmatrix.checks.expected import unmatched
from quantmatrix.checks.verdict import Verdict
from quantmatrix.measure.dequant import LogitError
from quantmatrix.measure.hf import HfGreedy
from quantmatrix.schema.model import Case, TensorFinding

# Quantizer sanity: the dequantized model's logits against the bf16 model's on the shipped prompts.
# Measured (factory v2, cpu_tiny): relative error 0.150 (Qwen3-MoE experts, both producers), 0.166 (Mixtral
# experts), 0.267 (Qwen3-MoE experts + attention); top-1 agreement 0.69-0.90. Swapping the nibble order of
# every packed weight gives 0.74 and top-1 0.25 (tests/test_factory.py keeps that control). MXFP4 (tiny gpt-oss,
# power-of-two scales per 32 inputs): 0.245, top-1 0.78; its E8M0 grid read transposed: 0.41, top-1 0.50
# (tests/test_mxfp4.py).
LOGIT_REL_ERROR_BOUND = 0.35
TOP1_AGREEMENT_BOUND = 0.6


def lint_verdict(case: Case, report: LintReport) -> Verdict:
    """The lint's findings must be exactly the ones the matrix expects (none, for a sound export), per tensor
    where the matrix names the tensor."""
    return Verdict.of(case, lint_problem(case.cell.checkpoint.expectation("lint"), report), [
        (P.LINT_DECLARED, f"{report.declared.producer} {report.declared.scheme}"),
        (P.LINT_FINDINGS, len(report.findings))])


def lint_problem(expected: tuple[str | TensorFinding, ...], report: LintReport) -> str | None:
    """Every expected code appears (a pinned one on each tensor its glob names: three planted `bad_value`s are
    three findings, not one code) and every finding is expected, by code or by code and tensor."""
    missing, unfound, extra = unmatched(expected, report.findings, lambda f: f.code, lambda f: (f.name,))
    parts = [f"expected findings {missing} did not appear"] if missing else []
    parts += [f"expected {e.code} on {e.tensor}: no such finding there" for e in unfound]
    if extra:
        parts.append(f"unexpected findings {sorted({f.code for f in extra})}" + "".join(
            f"\n  {f.code}: {f}" for f in extra))
    return f"{'; '.join(parts)}\n{report.render()}" if parts else None


def hf_verdict(case: Case, greedy: HfGreedy) -> Verdict:
    """The bf16 model loads in transformers from its own files and continues the prompts as its in-memory
    model (built from the same tensors, never saved) does."""
    return Verdict.of(case, hf_problem(greedy), [(P.HF_GREEDY_TOKEN_IDS, greedy.from_files)])


def hf_problem(greedy: HfGreedy) -> str | None:
    if not greedy.tokenizer_agrees:
        return "tokenizer.json on disk encodes the prompts differently from the tokenizer the factory trains"
    rows = [f"  {p!r}: in memory {w}, from the files {g}"
            for p, w, g in zip(greedy.prompts, greedy.in_memory, greedy.from_files, strict=True) if w != g]
    return ("greedy output of the model loaded from its files differs from the same weights' in-memory model "
            "(never saved):\n" + "\n".join(rows)) if rows else None


def dequant_verdict(case: Case, err: LogitError) -> Verdict:
    """The export's dequantized model stays within the logit bounds of the bf16 model it came from (a NaN error
    never passes: every comparison with NaN is false)."""
    strays = case.cell.checkpoint.expectation("dequant_strays", default=False)
    return Verdict.of(case, dequant_problem(err, strays), [(P.LOGIT_REL_ERROR, round(err.rel_error, 5)),
                                                   (P.TOP1_AGREEMENT, round(err.top1, 4))])


def dequant_problem(err: LogitError, strays: bool = False) -> str | None:
    """Within the bounds, or (`strays`: a deliberately broken export, matrix `dequant_strays: true`) beyond them."""
    within = err.rel_error <= LOGIT_REL_ERROR_BOUND and err.top1 >= TOP1_AGREEMENT_BOUND
    if strays:
        return None if not within else (
            f"the matrix says this export's files decode to a model beyond the bound (dequant_strays), but it stays "
            f"within: logit relative error {err.rel_error:.4f} (bound {LOGIT_REL_ERROR_BOUND}), top-1 agreement "
            f"{err.top1:.3f} (bound {TOP1_AGREEMENT_BOUND})")
    return None if within else (
        f"dequantized model strays from bf16: logit relative error {err.rel_error:.4f} (bound "
        f"{LOGIT_REL_ERROR_BOUND}), top-1 agreement {err.top1:.3f} (bound {TOP1_AGREEMENT_BOUND})")
