"""The checkpoint checks (suites/test_checkpoints.py): the lint's findings against `expect.lint`, the bf16
model's greedy output in transformers, the dequantized model's logits against bf16; each verdict shows the
numbers that decided."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from quantmatrix.checkpoints.lint import LintReport
from quantmatrix.checkpoints.store import DEQUANTIZED, base_spec, materialize_spec, spec_of
from quantmatrix.checks.verdict import Verdict
from quantmatrix.schema.model import Case

# Quantizer sanity: the dequantized model's logits against the bf16 model's on the shipped prompts.
# Measured (factory v2, cpu_tiny): relative error 0.150 (Qwen3-MoE experts, both producers), 0.166 (Mixtral
# experts), 0.267 (Qwen3-MoE experts + attention); top-1 agreement 0.69-0.90. Swapping the nibble order of
# every packed weight gives 0.74 and top-1 0.25 (tests/test_factory.py keeps that control).
LOGIT_REL_ERROR_BOUND = 0.35
TOP1_AGREEMENT_BOUND = 0.6


def lint_verdict(case: Case, report: LintReport) -> Verdict:
    """The lint's finding codes must be exactly the ones the matrix expects (none, for a sound export)."""
    return Verdict(lint_problem(case.cell.checkpoint.expectation("lint"), report), properties=[
        ("lint_declared", f"{report.declared.producer} {report.declared.scheme}"),
        ("lint_findings", len(report.findings))])


def lint_problem(expected: tuple[str, ...], report: LintReport) -> str | None:
    want, got = set(expected), report.codes()
    if want == got:
        return None
    missing, extra = sorted(want - got), sorted(got - want)
    parts = ([f"expected findings {missing} did not appear"] if missing else []) + (
        [f"unexpected findings {extra}"] if extra else [])
    return f"lint: {'; '.join(parts)}\n{report.render()}"


def digest(path: Path) -> str:
    """Content hash of a safetensors file: identical dequantized models are compared once."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hf_verdict(case: Case, greedy: tuple[list[list[int]], str | None]) -> Verdict:
    """The bf16 model loads in transformers from its own files and continues the prompts as recorded."""
    got, problem = greedy
    return Verdict(problem, properties=[("greedy_ids", got)])


def hf_reference(path: Path) -> tuple[list[list[int]], str | None]:
    """transformers' greedy output from the files on disk, and how it differs from the one the factory
    recorded from its in-memory copy (None: identical)."""
    from quantmatrix.checkpoints import base

    recorded = json.loads((path / base.REFERENCE_FILE).read_text())
    ids = base.encode(path, recorded["prompts"])
    if ids != recorded["input_ids"]:
        return [], "tokenizer.json on disk encodes the prompts differently from the tokenizer the factory trained"
    got = base.greedy(base.load_hf(path), ids)
    if got == recorded["greedy_ids"]:
        return got, None
    rows = [f"  {p!r}: recorded {r}, now {g}"
            for p, r, g in zip(recorded["prompts"], recorded["greedy_ids"], got, strict=True) if r != g]
    return got, (f"greedy output of the saved model differs from the one recorded at build time (recorded with "
                 f"{recorded['recorded_with']}):\n" + "\n".join(rows))


@dataclasses.dataclass(frozen=True)
class LogitError:
    rel_error: float  # max over prompts of ||dq - bf16|| / ||bf16||
    top1: float  # mean over prompts of the fraction of positions with the same argmax

    def problem(self) -> str | None:
        if self.rel_error <= LOGIT_REL_ERROR_BOUND and self.top1 >= TOP1_AGREEMENT_BOUND:
            return None
        return (f"dequantized model strays from bf16: logit relative error {self.rel_error:.4f} (bound "
                f"{LOGIT_REL_ERROR_BOUND}), top-1 agreement {self.top1:.3f} (bound {TOP1_AGREEMENT_BOUND})")


def dequant_verdict(case: Case, err: LogitError) -> Verdict:
    """The NVFP4 export's dequantized model stays within the logit bounds of the bf16 model it came from."""
    problem = err.problem()
    return Verdict(f"{case.cell.id}: {problem}" if problem else None, properties=[
        ("logit_rel_error", round(err.rel_error, 5)), ("top1_agreement", round(err.top1, 4))])


def base_dir(checkpoint: Any) -> Path:
    """The bf16 family member a synthetic NVFP4 checkpoint was quantized from, from the cache."""
    spec = base_spec(spec_of(checkpoint))
    return materialize_spec(spec, f"base-{spec.model}-{spec.size}-seed{spec.seed}")


def dequant_error(checkpoint_dir: Path, bf16_dir: Path) -> LogitError:
    from quantmatrix.checkpoints import base

    prompts = json.loads((bf16_dir / base.REFERENCE_FILE).read_text())["prompts"]
    ids = base.encode(bf16_dir, prompts)
    ref = base.logits(base.load_hf(bf16_dir), ids)
    dq = base.logits(base.load_hf(checkpoint_dir / DEQUANTIZED), ids)
    pairs = list(zip(dq, ref, strict=True))
    rel = max(((a - b).norm() / b.norm()).item() for a, b in pairs)
    top1 = sum((a.argmax(-1) == b.argmax(-1)).float().mean().item() for a, b in pairs) / len(pairs)
    return LogitError(rel, top1)
