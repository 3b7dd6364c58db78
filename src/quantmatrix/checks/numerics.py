"""layer_numerics: vLLM's MoE experts, on every backend the oracle picks or vLLM's override can force on the cell's
arch, stay within the matrix's bounds (`expect.numerics`) of the bf16 MoE the same files decode to. A backend whose
kernel cannot run on this host is the gpu tier's; a cell where none runs here is skipped with that reason, never
passed."""

from __future__ import annotations

from collections.abc import Sequence

from quantmatrix import properties as P
from quantmatrix.checks.verdict import Verdict
from quantmatrix.measure.numerics import BackendRun
from quantmatrix.schema.model import Case, NumericsBounds


def numerics_verdict(case: Case, runs: Sequence[BackendRun]) -> Verdict:
    if case.cell.checkpoint.expectation("resolves_to") == "rejected":
        return Verdict.skip("vLLM refuses this config, as the matrix expects: there is no layer to run")
    bounds: NumericsBounds = case.cell.checkpoint.expectation("numerics")
    ran = [r for r in runs if r.ran]
    elsewhere = [r for r in runs if r.not_here]
    properties = [(P.NUMERICS_RUNS, "; ".join(f"{r.describe()}: cos {r.cosine:.6f} rel {r.rel_error:.5f}"
                                              for r in ran)),
                  (P.NUMERICS_GPU_TIER, "; ".join(r.describe() for r in elsewhere)),
                  (P.NUMERICS_REFUSED, ",".join(f"{r.asked}@{r.where}" for r in runs if r.refused))]
    if not ran and elsewhere:
        why = "; ".join(f"{r.describe()}: {r.not_here}" for r in elsewhere)
        return Verdict.skip(f"no MoE backend vLLM picks or accepts for this checkpoint runs on this host, the gpu "
                            f"tier runs them ({why})", properties)
    if not ran:
        why = "; ".join(f"{r.describe()}: {r.refused}" for r in runs if r.asked == "auto")
        return Verdict.skip(f"vLLM builds no MoE layer for this checkpoint on this host's platform or the simulated "
                            f"arch ({why}): layer_dispatch judges that; the gpu tier runs the numerics", properties)
    return Verdict.of(case, numerics_problem(ran, bounds), properties)


def numerics_problem(ran: Sequence[BackendRun], bounds: NumericsBounds) -> str | None:
    """Every run within the bounds (a NaN never is: every comparison with NaN is false)."""
    bad = [r for r in ran if not (r.cosine is not None and r.rel_error is not None
                                  and r.cosine >= bounds.min_cosine and r.rel_error <= bounds.max_rel_error)]
    if not bad:
        return None
    rows = [f"  {r.describe()}: cosine {r.cosine:.6f} (least {bounds.min_cosine}), relative error "
            f"{r.rel_error:.5f} (most {bounds.max_rel_error})" for r in bad]
    return ("vLLM's MoE output strays from the bf16 reference of the same weights (a gate/up order, a scale "
            "layout or a swizzle the kernel reads differently from the checkpoint):\n" + "\n".join(rows))
