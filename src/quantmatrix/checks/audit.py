"""The post-load audit's verdict: which MoE tensors the selected kernel reads were never written by vLLM's
loaders, and which loaded scales are unusable. The findings are measured (measure.sentinel: the sentinel-filled
load; measure.findings: the values); this module only judges them, so importing it costs nothing (no torch)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from quantmatrix import properties as P
from quantmatrix.adapter.layers import LayerBuild
from quantmatrix.adapter.roles import checkpoint_names
from quantmatrix.checks.expected import describe, unmatched
from quantmatrix.checks.verdict import Verdict
from quantmatrix.measure.loaded import AuditReport
from quantmatrix.schema.model import Case, MoeBackend, TensorFinding


def audit_verdict(case: Case, build: LayerBuild, backends: Mapping[str, MoeBackend],
                  report: AuditReport | None) -> Verdict:
    """Every tensor the selected backend reads was loaded from the checkpoint and holds a usable value (or the
    audit finds exactly what the matrix's `expect.audit` names, for a malformed checkpoint)."""
    ck, arch = case.cell.checkpoint, case.cell.arch
    if build.layer is None and ck.expectation("resolves_to") == "rejected":
        return Verdict.skip("vLLM refuses this config, as the matrix expects: there is no layer to audit")
    measured = build.layer is not None and build.layer.backend in backends and report is not None
    expected = ck.expectation("audit", arch) if measured else ()
    problem = audit_problem(build, backends, report, f"{ck.producer} {ck.scheme.name} on {arch.describe()}",
                            ck.expectation("resolves_to") == "weight_only", expected)
    if not measured or report is None:
        return Verdict.fail(case, problem or "")
    return Verdict.of(case, problem, [
        (P.MOE_BACKEND, report.backend),
        (P.UNLOADED_UNREAD, "; ".join(f.describe() for f in report.notes if f.kind == "unloaded")),
        (P.AUDIT_NOTES, "; ".join(f.describe() for f in report.notes if f.kind != "unloaded"))])


def audit_problem(build: LayerBuild, backends: Mapping[str, MoeBackend], report: AuditReport | None,
                  cell_words: str, weight_only_checkpoint: bool,
                  expected: Iterable[str | TensorFinding] = ()) -> str | None:
    """Why the audit fails (no layer, a backend whose reads are unknown, or problem_of's findings), or None."""
    layer = build.layer
    if layer is None:
        return f"no MoE layer to audit: vLLM refused to build it ({build.error})"
    if layer.backend not in backends or report is None:
        return f"backend {layer.backend} is not described under moe_backends, so what it reads is unknown"
    return problem_of(report, cell_words, weight_only_checkpoint, expected)


def problem_of(report: AuditReport, cell_words: str, weight_only_checkpoint: bool,
               expected: Iterable[str | TensorFinding] = ()) -> str | None:
    """None when the audit found exactly what the matrix expects (usually nothing), else what breaks and why.
    Compared as the lint's findings are (checks.expected): a kind anywhere, or a kind pinned to checkpoint tensors
    (a fused parameter's finding stands for the tensors its expert rows were loaded from, adapter.roles)."""
    problems = report.read_but_unloaded + report.unusable
    missing, unfound, extra = unmatched(expected, problems, lambda f: f.kind,
                                        lambda f: checkpoint_names(f.param, f.experts))
    if not (missing or unfound or extra):
        return None
    if not problems:
        return (f"{cell_words}: the matrix expects the audit to find {describe(expected)} in tensors "
                f"backend {report.backend} reads, but every read tensor was loaded and usable")
    names = "; ".join(f.describe() for f in problems)
    head = f"{cell_words}: backend {report.backend} reads tensors that"
    if report.read_but_unloaded and not report.unusable:
        head += " were never loaded from the checkpoint"
    elif not report.read_but_unloaded:
        head += " were loaded with unusable values"
    else:
        head += " were never loaded or hold unusable values"
    why = ""
    if any(f.role == "input_scale" for f in report.read_but_unloaded):
        why = (" - input_scale is folded into g1_alphas/g2_alphas, so every expert output is scaled by whatever "
               "memory held (0.0 on GB10 zeroed every expert)")
        if weight_only_checkpoint:
            why = " - weight-only checkpoint routed to a W4A4 fused-MoE backend: it has no input_scale" + why
    tail = f" [the matrix also expected: {describe([*missing, *unfound])}]" if missing or unfound else ""
    return f"{head}: {names}{why}{tail}"
