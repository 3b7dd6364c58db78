"""The guard's verdict: every recorded layer judged against its backend's read-set (the packaged read-sets, or a
matrix's) by the post-load audit's own code (measure.findings, checks.audit.problem_of), and one refusal text that
names the layer, tensor, experts, backend, checkpoint file and what to do. What to do compares what the checkpoint
declares (adapter.declared, the lint's and config dispatch's own reading) with what vLLM built: the seed bug is a
weight-only checkpoint whose layers were built W4A4."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import torch

from quantmatrix.adapter import loaders
from quantmatrix.adapter.declared import Declaration
from quantmatrix.checks.audit import problem_of
from quantmatrix.errors import AdapterMismatch
from quantmatrix.guard.record import Layer, Recorder, unloaded_mask
from quantmatrix.measure import findings
from quantmatrix.measure.loaded import AuditReport, Finding
from quantmatrix.schema.model import MoeBackend
from quantmatrix.schema.vocab import ROLES

# A backend without a read-set reads whatever it was given, except activation scales when vLLM's own method says
# activations stay unquantized (a weight-only linear method registers a W4A16 checkpoint's input_scale only to drop it).
EVERY_ROLE = frozenset(ROLES)
WEIGHT_ONLY_ROLES = EVERY_ROLE - {"input_scale"}


@dataclasses.dataclass(frozen=True)
class LayerResult:
    layer: str
    kind: str
    method: str
    backend: str
    weight_only: bool  # the method's own view (MoE use_a16, a linear method without an activation key)
    known_backend: bool
    report: AuditReport
    declared: Declaration | None = None  # what the checkpoint's quantization config declares, None: not known

    @property
    def problems(self) -> list[Finding]:
        return self.report.read_but_unloaded + self.report.unusable


@dataclasses.dataclass(frozen=True)
class Outcome:
    layers: tuple[LayerResult, ...]
    tensors: int
    direct: bool = False  # no weight_loader ran (sharded_state writes param.data): loadedness was not measured

    @property
    def problems(self) -> list[tuple[LayerResult, Finding]]:
        return [(r, f) for r in self.layers for f in r.problems]


def judge_layer(layer: Layer, backends: Mapping[str, MoeBackend], declared: Declaration | None = None,
                direct: bool = False) -> LayerResult:
    method, backend, weight_only = loaders.method_and_backend(layer.module)
    known = backends.get(backend)
    reads = known.reads if known is not None else WEIGHT_ONLY_ROLES if weight_only else EVERY_ROLE
    experts = loaders.num_local_experts(layer.module) if layer.kind == "moe" else -1
    params = {f"{layer.name}.{n}": p for n, p in layer.params.items()}
    masks = {f"{layer.name}.{n}": unloaded_mask(layer, n, direct) for n in layer.params}
    report = findings.measure_layer(params, masks, backend, reads, known is not None and known.single_input_scale,
                                  experts, layer.misplaced)
    return LayerResult(layer.name, layer.kind, method, backend, weight_only, known is not None, report, declared)


def judge(recorder: Recorder, backends: Mapping[str, MoeBackend], declared: Declaration | None = None) -> Outcome:
    """Every recorded layer against its backend's read-set; `declared` (adapter.declared.of_model) lets the advice
    name a weight-only checkpoint that vLLM built W4A4."""
    if recorder.errors:
        raise AdapterMismatch(f"{len(recorder.errors)} weight_loader call(s) could not be read, e.g. "
                              f"{recorder.errors[0]}; update quantmatrix/adapter/loaders.py")
    direct = recorder.calls == 0 and bool(recorder.layers)
    results = tuple(judge_layer(layer, backends, declared, direct) for layer in recorder.layers)
    rest, count = judge_rest(recorder)
    return Outcome((*results, rest), sum(len(r.params) for r in recorder.layers) + count, direct)


def judge_rest(recorder: Recorder) -> tuple[LayerResult, int]:
    """Every other parameter and buffer of the model (norms, embeddings, routers, e_score_correction_bias, rotary
    caches) for non-finite values: a NaN norm weight is read by every token as surely as an expert's."""
    judged = {f"{layer.name}.{n}" for layer in recorder.layers for n in layer.params}
    tensors: dict[str, torch.Tensor] = {}
    for prefix, root in recorder.roots:
        for name, t in (*root.named_parameters(), *root.named_buffers()):
            full = prefix + name
            if full not in judged and t is not None and t.dtype.is_floating_point:
                tensors[full] = t.data if isinstance(t, torch.nn.Parameter) else t
    found = tuple(f for name, t in tensors.items() for f in findings.nonfinite(name, t))
    report = AuditReport("-", EVERY_ROLE, found, frozenset(tensors))
    return LayerResult("(other parameters and buffers)", "other", "-", "-", False, True, report), len(tensors)


def _advice(result: LayerResult) -> str:
    roles = {f.role for f in result.report.read_but_unloaded}
    d = result.declared
    if any(f.kind == "misplaced" for f in result.report.unusable):
        return ("vLLM's weight loader put a rank's shard where the parallel layout does not (a vLLM bug, not the "
                "checkpoint): serve it with another tensor/expert-parallel layout or another vLLM, and report it")
    if result.report.unusable and not roles:
        return "the checkpoint itself is broken (values no kernel can use): re-export or re-download it"
    if "input_scale" in roles and d is not None and d.scheme == "weight_only" and not result.weight_only:
        return (f"a weight-only checkpoint routed to W4A4: it declares weight-only ({declaration_words(d)}) but vLLM "
                f"built {result.method} as W4A4 on backend {result.backend}, which reads the activation scales it "
                f"never had; route it to Marlin with {loaders.ROUTE_WEIGHT_ONLY}, or use a vLLM that routes this "
                "config weight-only")
    if "input_scale" in roles and result.weight_only:
        return (f"a weight-only checkpoint routed to a backend that reads activation scales: route it with "
                f"{loaders.ROUTE_WEIGHT_ONLY}, or use a vLLM that routes weight-only NVFP4 to Marlin")
    if roles == {"input_scale"}:
        return (f"the checkpoint lacks input_scale for these experts: re-export it with calibrated activation "
                f"scales, or serve it weight-only with {loaders.ROUTE_WEIGHT_ONLY}")
    return "the checkpoint lacks tensors this backend reads: it is incomplete or broken; re-export it"


def declaration_words(d: Declaration) -> str:
    """The config's own words for its scheme: `modelopt quant_algo NVFP4, g input_activations null`."""
    algo = f" quant_algo {d.algo}" if d.algo else ""
    return f"{d.producer}{algo}, {d.groups_text()}"


def refusal(outcome: Outcome, files: Callable[[str], list[str]]) -> str:
    """One paragraph per offending layer (what the audit would say, plus the file and the fix)."""
    parts = []
    for r in outcome.layers:
        if not r.problems:
            continue
        if r.kind == "other":
            names = "; ".join(f.describe() for f in r.problems)
            parts.append(f"{r.layer}: non-finite values: {names}\n  what to do: {_advice(r)}")
            continue
        words = f"layer {r.layer} ({r.method}{', weight-only' if r.weight_only else ''})"
        text = problem_of(r.report, words, r.weight_only) or ""
        if not r.known_backend:
            text += (f" [backend {r.backend} has no read-set in quantmatrix/data/backends.yaml: every tensor it "
                     f"was given counts as read{', except input_scale (weight-only)' if r.weight_only else ''}]")
        prefix = r.layer.rsplit(".", 1)[0] + "." if r.kind == "linear" else r.layer + "."
        where = ", ".join(files(prefix)) or "(checkpoint files not local)"
        parts.append(f"{text}\n  checkpoint file(s) for {prefix}*: {where}\n  what to do: {_advice(r)}")
    return "\n".join(parts)
