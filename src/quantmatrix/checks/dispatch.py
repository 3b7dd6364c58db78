"""Quant-path dispatch, config level and layer level: did vLLM route this checkpoint to the scheme (and the MoE
kernel backend) the matrix expects?

The verdict explains itself in terms of the kernel: the seed bug was a weight-only checkpoint routed to W4A4,
where the fused-MoE path folds an input_scale nobody loaded into g1_alphas.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from quantmatrix import bounded
from quantmatrix import properties as P
from quantmatrix.adapter.config import Resolution
from quantmatrix.adapter.declared import Declaration, declare
from quantmatrix.adapter.layers import LayerBuild
from quantmatrix.checks.verdict import Verdict
from quantmatrix.schema import factory
from quantmatrix.schema.model import Case, Checkpoint, MoeBackend

_CONSEQUENCE = {
    ("weight_only", "w4a4"): "the fused-MoE path would fold an uninitialised input_scale into g1_alphas "
                             "(the checkpoint has none), zeroing or scaling every expert by whatever "
                             "memory held",
    ("w4a4", "weight_only"): "the calibrated input_scale would be ignored and activations would run "
                             "unquantized through Marlin: not the kernel this checkpoint was exported for",
    ("weight_only", "unquantized"): "packed NVFP4 weights would be loaded into bf16 layers",
    ("w4a4", "unquantized"): "packed NVFP4 weights would be loaded into bf16 layers",
    ("unquantized", "weight_only"): "a bf16 checkpoint would be loaded through an NVFP4 kernel",
    ("unquantized", "w4a4"): "a bf16 checkpoint would be loaded through an NVFP4 kernel",
}
_STATIC_READ = ("the kernel would read a per-tensor input_scale the checkpoint never filled (vLLM's initial value "
                "or uninitialised memory scales every expert)")
_CONSEQUENCE.update({
    ("fp8_dynamic", "fp8_static"): _STATIC_READ,
    ("fp8_block", "fp8_static"): _STATIC_READ,
    ("fp8_static", "fp8_dynamic"): "the calibrated input_scale would be ignored: activations quantized per token, "
                                   "not as the checkpoint was exported",
    ("fp8_block", "fp8_dynamic"): "128x128 block scales would be read as per-tensor or per-channel scales",
    ("fp8_dynamic", "fp8_block"): "per-tensor or per-channel weight scales would be read as a 128x128 block grid",
    ("fp8_static", "fp8_block"): "per-tensor weight scales would be read as a 128x128 block grid",
    ("mxfp4", "unquantized"): "packed MXFP4 blocks and E8M0 scales would be loaded into bf16 layers",
    ("mxfp8", "unquantized"): "E4M3 weights and their E8M0 scales would be loaded into bf16 layers",
    ("mxfp8", "fp8_static"): "E8M0 per-32 block scales would be read as per-tensor float scales, and the kernel "
                             "would read an input_scale the checkpoint never filled",
})
# Where a scheme family (schema.factory's scheme module) words a resolution otherwise than NVFP4 does: the words and
# the consequence of a wrong routing, per (expected, got).
_FAMILY_WORDS = {"wna16": {"weight_only": "weight-only integer (WNA16)"}}
_FAMILY_CONSEQUENCE = {
    ("wna16", "weight_only", "unquantized"): "the packed int32 weights would meet bf16 expert layers (vLLM's "
                                             "unquantized method reads packed ints as weights, or leaves its bf16 "
                                             "weights unloaded)",
}
_SCHEME_WORDS = {"weight_only": "weight-only NVFP4", "w4a4": "W4A4 NVFP4", "fp8_static": "static-activation FP8",
                 "fp8_dynamic": "dynamic-activation FP8", "fp8_block": "block-wise FP8", "w8a8_int8": "W8A8 INT8",
                 "w4a8_fp8": "W4A8 (INT4 weights, FP8 activations)", "mxfp4": "MXFP4", "mxfp8": "MXFP8",
                 "unquantized": "unquantized",
                 "rejected": "a rejected"}


def _groups_part(d: Declaration) -> str:
    if not d.groups:
        return d.groups_text()
    acts = sorted({acts for _, acts in d.groups})
    return f"{len(d.groups)} config group(s); input_activations={'/'.join(acts)}"


def config_shape(checkpoint_dir: Path) -> str:
    """A one-line description of the config's shape, so a reader knows which resolution rule decided (the config
    groups as adapter.declared reads them for the lint and the guard)."""
    cfg = json.loads(bounded.read_bytes(checkpoint_dir / "config.json", "config"))
    qc = cfg.get("quantization_config")
    legacy = checkpoint_dir / "hf_quant_config.json"
    if qc is None and legacy.is_file():
        whole = json.loads(bounded.read_bytes(legacy, "config"))
        d = declare(whole, legacy=True)
        groups = "no config_groups" if d.groups_shape == "missing" else _groups_part(d)
        return f"hf_quant_config.json (legacy); quant_algo={whole.get('quantization', {}).get('quant_algo')}; {groups}"
    if qc is None:
        return "no quantization config"
    parts = [f"config.json quantization_config; quant_method={qc.get('quant_method')}"]
    if "quant_algo" in qc:
        parts.append(f"quant_algo={qc['quant_algo']}")
    return "; ".join([*parts, _groups_part(declare(qc))])


def _words(scheme: str, family: str) -> str:
    """A resolves_to word as the checkpoint's scheme family says it (integer weight-only is not NVFP4)."""
    return _FAMILY_WORDS.get(family, {}).get(scheme, _SCHEME_WORDS[scheme])


def config_verdict(case: Case, checkpoint_dir: Path, got: Resolution) -> Verdict:
    """The checkpoint's config, through vLLM's real resolution, picks the scheme (and method) the matrix expects."""
    shape = config_shape(checkpoint_dir)
    ck = case.cell.checkpoint
    problem = _config_problem(ck, got, shape) or projections_problem(got, ck.expectation("unquantized", default=None))
    mixed = [(P.MIXED_PROJECTIONS, "; ".join(p.describe() for p in got.projections))] if got.projections else []
    return Verdict.of(case, problem, [
        (P.CONFIG_SHAPE, shape), (P.QUANT_METHOD, got.method), (P.QUANT_CONFIG_CLASS, got.config_class),
        (P.RESOLVED_ALGO, got.algo), (P.RESOLVED_SCHEME, got.scheme), *mixed])


def projections_problem(got: Resolution, unquantized: Sequence[str] | None = None) -> str | None:
    """MIXED_PRECISION: every linear module vLLM built runs what the checkpoint's quantized_layers declares for the
    modules it loads (a quantized one built bf16 loads the quantized bytes as weights and drops their scales), and
    the ones built unquantized are exactly the matrix's `unquantized`, where it names them."""
    wrong = [p for p in got.projections if p.declared != p.built]
    if not wrong:
        return _unquantized_problem(got, unquantized)
    parts = []
    for p in wrong:
        loads = ", ".join(m.rpartition(".")[2] for m in p.modules)
        why = (": its quantized weights would be loaded into a bf16 layer and their scales dropped"
               if p.built == "unquantized" else
               ": a bf16 weight would be read as quantized" if p.declared == "unquantized" else "")
        declared, built = _SCHEME_WORDS.get(p.declared, p.declared), _SCHEME_WORDS.get(p.built, p.built)
        parts.append(f"{p.prefix} (loads {loads}): quantized_layers declares {declared}, vLLM built {p.method} "
                     f"({built}){why}")
    return (f"{len(wrong)} of {len(got.projections)} MIXED_PRECISION linear module(s) built other than the "
            f"checkpoint declares: " + "; ".join(parts))


def _unquantized_problem(got: Resolution, unquantized: Sequence[str] | None) -> str | None:
    if unquantized is None or not got.projections:
        return None
    built = {p.prefix for p in got.projections if p.built == "unquantized"}
    quantized, bf16 = sorted(set(unquantized) - built), sorted(built - set(unquantized))
    if not quantized and not bf16:
        return None
    parts = ([f"built quantized, but the matrix says it must stay unquantized: {', '.join(quantized)}"] if quantized
             else []) + ([f"built unquantized, which the matrix does not expect: {', '.join(bf16)}"] if bf16 else [])
    return "MIXED_PRECISION linear modules " + "; ".join(parts)


def _config_problem(checkpoint: Checkpoint, got: Resolution, shape: str) -> str | None:
    """The matrix's expectations, each read only where the verdict turns on it (a matrix need not state a
    method for a config vLLM must refuse)."""
    expected = checkpoint.expectation("resolves_to")
    settled = got.scheme == expected
    because = checkpoint.expectation("rejected_because") if settled and expected == "rejected" else None
    method = checkpoint.expectation("quant_method") if settled and expected != "rejected" else None
    matched = because is not None and bounded.regex(because).search(got.detail) is not None
    family = factory.SCHEMES[checkpoint.scheme.factory].module if checkpoint.scheme.factory in factory.SCHEMES else ""
    return config_problem(expected, method, because, matched, got, shape, family)


def config_problem(expected: str, method: str | None, because: str | None, matched: bool, got: Resolution,
                   shape: str, family: str = "") -> str | None:
    """None when the resolution is what the matrix expects (scheme `expected`; then the quant `method`, or for a
    refusal vLLM's words matching the pattern `because`, which the caller searched: `matched`), else the message
    a maintainer reads; `family` as for layer_problem."""
    if got.scheme != expected:
        routed = f"{got.method}/{got.algo}" if got.algo else got.method
        head = (f"{_SCHEME_WORDS[expected]} checkpoint resolved to {_words(got.scheme, family)} "
                f"({routed})" if got.scheme != "rejected" else
                f"{_SCHEME_WORDS[expected]} checkpoint was rejected by vLLM: {got.detail}")
        why = _CONSEQUENCE.get((expected, got.scheme))
        if expected == "rejected":
            why = "the matrix says vLLM must refuse this config rather than guess a kernel"
        return (f"{head}: {why}" if why else head) + f" [config shape: {shape}]"
    if expected == "rejected":
        if not matched:
            return (f"vLLM rejected the config, but not for the reason the matrix expects: {got.detail!r} does not "
                    f"match {because!r} [config shape: {shape}]")
        return None
    if got.method != method:
        return (f"checkpoint claimed by vLLM quantization method {got.method!r}, expected "
                f"{method!r} [config shape: {shape}]")
    return None


# ------------------------------------------------------------------------------ layer-level dispatch


def layer_verdict(case: Case, build: LayerBuild, backends: Mapping[str, MoeBackend]) -> Verdict:
    """vLLM's MoE layer as built on the cell's arch: method, weight/activation scheme and backend are what the
    matrix accepts."""
    layer = build.layer
    return Verdict.of(case, _layer_problem(case, build, backends), [
        (P.MOE_METHOD, layer.method if layer else ""), (P.MOE_BACKEND, layer.backend if layer else ""),
        (P.MOE_WEIGHT_ONLY, str(layer.weight_only).lower() if layer else ""),
        (P.LAYER_BUILD_ERROR, build.error or "")])


def _layer_problem(case: Case, build: LayerBuild, backends: Mapping[str, MoeBackend]) -> str | None:
    """The matrix's expectations for the cell's arch, read only once there is a layer to judge."""
    ck, arch = case.cell.checkpoint, case.cell.arch
    expected = ck.expectation("resolves_to")
    built = expected != "rejected" and build.layer is not None
    wanted = ck.expectation("activation_scales", arch) if built else None
    pinned = ck.expectation("moe_backend", arch, default=None) if built else None
    family = factory.SCHEMES[ck.scheme.factory].module if ck.scheme.factory in factory.SCHEMES else ""
    return layer_problem(expected, wanted, pinned, f"on {arch.describe()}", build, backends, family)


def layer_problem(expected: str, wanted: str | None, pinned: list[str] | None, on: str, build: LayerBuild,
                  backends: Mapping[str, MoeBackend], family: str = "") -> str | None:
    """The message names what was routed where and why it hurts: `expected` scheme, `wanted` activation scales
    (read / not_read / any), the `pinned` backends, if any, of the arch the layer was built `on`; `family`: the
    checkpoint's scheme module (schema.factory), where it words the scheme its own way."""
    if expected == "rejected":
        return None if build.layer is None else (
            f"vLLM built {build.layer.method} with backend {build.layer.backend} {on} for a config the matrix says "
            "it must refuse")
    if build.layer is None:
        return f"vLLM could not build the MoE layer {on}: {build.error}"
    layer = build.layer
    got = layer.scheme or ("weight_only" if layer.weight_only else "w4a4")  # a Built record from before schemes
    if got != expected:
        why = _FAMILY_CONSEQUENCE.get((family, expected, got)) or _CONSEQUENCE.get((expected, got))
        return (f"{_words(expected, family)} checkpoint built as {_SCHEME_WORDS[got]} MoE ({layer.method}, "
                f"backend {layer.backend}) {on}" + (f": {why}" if why else ""))
    backend = backends.get(layer.backend)
    if backend is None:
        return (f"vLLM selected MoE backend {layer.backend} {on}, which the matrix does not describe: add it under "
                f"moe_backends with the tensors it reads (known: {', '.join(backends)})")
    if wanted == "not_read" and backend.reads_activation_scales:
        return (f"weight-only checkpoint routed to W4A4 fused MoE backend {backend.name} {on}: input_scale would be "
                "read uninitialised (the checkpoint has none)")
    if wanted == "read" and not backend.reads_activation_scales:
        return (f"W4A4 checkpoint routed to {backend.name} {on}, which never reads activation scales: its calibrated "
                "input_scale is discarded and activations run unquantized")
    if pinned is not None and backend.name not in pinned:
        return f"MoE backend {backend.name} selected {on}; the matrix pins {', '.join(pinned)} for this arch"
    return None
