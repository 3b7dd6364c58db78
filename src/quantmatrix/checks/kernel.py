"""kernel_format: what vLLM's post-load conversion hands the fused-MoE kernel. The dequant alphas must be there
and finite (the seed bug folded an uninitialised input_scale into `g1_alphas`), and the activation scales must be
kept exactly when the matrix says the backend reads them, and exactly when the backend's read-set says it reads
`input_scale`: the read-sets that drive the audit and the guard are observed here, not trusted. Where the backend
is Marlin, the converted block scales read back through Marlin's layout must be the loaded ones (a permutation
computed for the wrong size scrambles every group's scale while every shape still fits). On a host without
CUDA the conversion's CUDA-only kernels run as shape-preserving stand-ins (adapter.standins), named in the case."""

from __future__ import annotations

from collections.abc import Mapping

from quantmatrix import properties as P
from quantmatrix.adapter.kernel import ACTIVATION_SCALES, ALPHAS, KernelFormat
from quantmatrix.adapter.layers import LayerBuild
from quantmatrix.checks.verdict import Verdict
from quantmatrix.schema.model import Case, MoeBackend


def kernel_verdict(case: Case, build: LayerBuild, backends: Mapping[str, MoeBackend],
                   kf: KernelFormat | None) -> Verdict:
    ck, arch = case.cell.checkpoint, case.cell.arch
    if (build.layer is None or kf is None) and ck.expectation("resolves_to") == "rejected":
        return Verdict.skip("vLLM refuses this config, as the matrix expects: there is no layer to convert")
    if build.layer is None or kf is None:
        return Verdict.fail(case, kernel_problem(build, backends, kf, arch.describe(), "any") or "")
    if kf.needs_cuda:
        return Verdict.skip(kf.needs_cuda)
    if kf.refused:
        return Verdict.skip(f"{kf.refused}: an engine fails to load it, nothing is silently wrong to check")
    properties = [(P.QUANT_CONFIG, kf.quant_config or ""), (P.ACTIVATION_SCALES_KEPT, ",".join(kf.activation_scales))]
    if kf.stand_ins:
        properties.append((P.STAND_INS, "; ".join(kf.stand_ins)))
    if kf.marlin_scales:
        properties.append((P.MARLIN_SCALES, ",".join(kf.marlin_scales)))
    wanted = ck.expectation("activation_scales", arch, default="any")
    return Verdict.of(case, kernel_problem(build, backends, kf, arch.describe(), wanted), properties)


def kernel_problem(build: LayerBuild, backends: Mapping[str, MoeBackend], kf: KernelFormat | None, arch: str,
                   activation_scales: str) -> str | None:
    """What is wrong with the kernel format of the layer built on `arch` (a conversion that needs CUDA is no
    verdict: the caller skips it first), or None."""
    if build.layer is None or kf is None:
        return f"vLLM refused to build the MoE layer: {build.error}"
    on = f"backend {build.layer.backend} on {arch}"
    backend = backends.get(build.layer.backend)
    if kf.quant_config is None:
        return (f"{on}: vLLM built no fused-MoE quant config after conversion, so nothing says what the kernel "
                "reads")
    if backend is None:
        return f"{on}: backend {build.layer.backend} is not described under moe_backends"
    return _problem(on, kf, backend, activation_scales)


def _problem(on: str, kf: KernelFormat, backend: MoeBackend, activation_scales: str) -> str | None:
    if backend.kernel_alphas:
        missing = [n for n in ALPHAS if kf.alphas.get(n) is None]
        if missing:
            return (f"{on}: the quant config {kf.quant_config} holds no {', '.join(missing)}: the dequant alphas are "
                    "gone")
        bad = [n for n in ALPHAS if kf.alphas.get(n) is False]
        if bad:
            return (f"{on}: {', '.join(bad)} hold non-finite values after kernel-format conversion: every expert "
                    "output through them is NaN or inf")
    kept = bool(kf.activation_scales)
    if activation_scales == "not_read" and kept:
        return (f"{on}: weight-only checkpoint, yet the kernel format carries activation scales "
                f"({', '.join(kf.activation_scales)}): a W4A4 kernel would quantize activations with scales the "
                "checkpoint never had")
    if activation_scales == "read" and not kept:
        return (f"{on}: the checkpoint's calibrated activation scales were dropped (no "
                f"{'/'.join(ACTIVATION_SCALES)} in the kernel format): activations run unquantized")
    if backend.reads_activation_scales and not kept:
        return (f"{on}: the read-set (quantmatrix/data/backends.yaml) says {backend.name} reads input_scale, yet the "
                f"conversion kept no activation scale (no {'/'.join(ACTIVATION_SCALES)}): the read-set the audit and "
                "the guard trust is wrong, or the conversion dropped the checkpoint's calibration")
    if kept and not backend.reads_activation_scales:
        return (f"{on}: the conversion hands the kernel {', '.join(kf.activation_scales)}, but the read-set "
                f"(quantmatrix/data/backends.yaml) says {backend.name} never reads input_scale: the audit and the "
                "guard would not check a tensor this kernel is given")
    if kf.marlin_wrong:
        return (f"{on}: read back through Marlin's scale layout (adapter.marlin_layout), the converted scales are "
                f"not the loaded ones: {'; '.join(kf.marlin_wrong)}")
    return None
