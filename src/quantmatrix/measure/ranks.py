"""What one rank of a parallel layout measures of a checkpoint, inside the rank's own process (measure.pool starts
the ranks, one process each, in a real gloo world): vLLM's MoE blocks built at this rank as on every arch, the
checkpoint loaded through vLLM's own weight loaders with two sentinel fills (measure.sentinel) while each weight
loader's writes are recorded, the loaded tensors against the reference split (measure.shards), and vLLM's
kernel-format conversion of a fresh load per backend. A rank's load does not depend on the simulated arch, only its
backend does: archs whose blocks have the same parameters share one load. What it returns is data
(measure.ranked)."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from quantmatrix.adapter import kernel, layers, loaders, parallel, wna16
from quantmatrix.adapter.kernel import KernelFormat
from quantmatrix.adapter.parallel import RankFacts
from quantmatrix.adapter.roles import fused_parts
from quantmatrix.measure import sentinel, shards, split
from quantmatrix.measure.loaded import AuditReport, Finding
from quantmatrix.measure.ranked import ArchResult, Job, RankResult, ShardFinding


@dataclasses.dataclass
class _Shared:
    """One load of a rank's layers, shared by the archs whose blocks have the same parameters."""

    loaded: list[sentinel.Loaded]
    facts: RankFacts
    shards: list[ShardFinding]
    compared: int
    strays: list[tuple[str, int, tuple[int, ...]]]
    global_params: list[str]


def measure(job: Job, rank: int) -> RankResult:
    """Everything this rank measures of `job` (call it in a rank process: adapter.parallel.init_rank first)."""
    start = time.perf_counter()
    path = Path(job.checkpoint)
    ck = split.Checkpoint(path)
    tensors = sentinel.checkpoint_tensors(path)
    loads: dict[tuple[Any, ...], _Shared] = {}
    kernels: dict[tuple[Any, ...], KernelFormat] = {}
    archs: dict[str, ArchResult] = {}
    shared: _Shared | None = None
    for name, capability in job.archs:
        build = layers.build(path, capability, every_layer=True)
        if build.layer is None:
            archs[name] = ArchResult(error=build.error, simulated_without=build.simulated_without)
            continue
        sig = _signature(build.layers)
        if sig not in loads:
            loads[sig] = _load(build.layers, tensors, rank, job, ck)
        shared = loads[sig]
        layer = build.layer
        known = job.backends.get(layer.backend)
        audit = _audit(shared, layer.backend, known, rank) if known is not None else None
        if (sig, layer.backend) not in kernels:
            kernels[sig, layer.backend] = _kernel(path, capability)
        archs[name] = ArchResult(layer.method, layer.backend, layer.weight_only, None, build.simulated_without,
                                 audit, kernels[sig, layer.backend], layer.scheme)
    if shared is None:
        return RankResult(rank, None, archs, note=parallel.note(), seconds=time.perf_counter() - start)
    return RankResult(rank, shared.facts, archs, tuple(shared.shards), shared.compared, tuple(shared.strays),
                      tuple(shared.global_params), parallel.note(), time.perf_counter() - start)


def _signature(built: list[layers.MoELayer]) -> tuple[Any, ...]:
    return tuple((layer.method, *((n, tuple(p.shape), str(p.dtype)) for n, p in layer.parameters().items()))
                 for layer in built)


def _load(built: list[layers.MoELayer], tensors: Callable[[], Any], rank: int, job: Job,
          ck: split.Checkpoint) -> _Shared:
    """The two sentinel loads of every layer, noting every write a weight loader makes for an expert this rank
    does not hold, then the loaded tensors against the reference split."""
    facts = parallel.rank_facts(built[0].experts)
    strays: list[tuple[str, int, tuple[int, ...]]] = []
    undo = [loaders.wrap_weight_loader(p, functools.partial(_recording, experts=layer.experts,
                                                            name=layer.prefix + n, strays=strays))
            for layer in built for n, p in layer.parameters().items() if fused_parts(layer.prefix + n)]
    try:
        loaded = [dataclasses.replace(sentinel.load_twice(layer, tensors), num_experts=len(facts.experts),
                                      global_experts=facts.global_experts)
                  for layer in built]
    finally:
        for u in undo:
            u()
    params = {n: p for one in loaded for n, p in one.params.items()}
    logical = _logical(params, wna16.storage(built[0].experts), ck)
    found, compared = shards.compare_rank(logical, facts, rank, job.tp, job.ep, ck)
    global_params = [n for n, p in params.items() if fused_parts(n) and p.dim() and len(facts.experts)
                     != facts.global_experts == p.shape[0]]
    return _Shared(loaded, facts, found, compared, sorted(set(strays)), global_params)


def _logical(params: dict[str, torch.Tensor], method: str, ck: split.Checkpoint) -> dict[str, torch.Tensor]:
    """The loaded fused expert parameters in the form the checkpoint is split in (logical codes, zero points and
    scales for packed integer checkpoints: measure.logical), the rest as loaded."""
    if ck.logical is None:
        return params
    return {n: wna16.logical_param(method, parts[2], p.data, ck.logical.bits) if (parts := fused_parts(n)) else p
            for n, p in params.items()}


_MARK = 0xC3  # fills a parameter while a loader writes an expert this rank does not hold: what changed was written


def _recording(original: Callable[..., Any], experts: Any, name: str,
               strays: list[tuple[str, int, tuple[int, ...]]]) -> Callable[..., Any]:
    """A weight_loader that, for an expert this rank does not hold, notes which rows the call wrote (vLLM's own
    answer is False and no write); the parameter keeps whatever the call wrote."""
    @functools.wraps(original)
    def recording(*args: Any, **kwargs: Any) -> Any:
        call = loaders.moe_call(args, kwargs)
        if call["expert_id"] is None or getattr(call["loaded_weight"], "dim", lambda: 0)() == 3:
            return original(*args, **kwargs)  # every expert at once (gpt-oss's loader): the rank's slice
        expert, param = int(call["expert_id"]), call["param"]
        if loaders.local_row(experts, expert) >= 0:
            return original(*args, **kwargs)
        before = param.data.clone()
        param.data.view(torch.uint8).fill_(_MARK)
        try:
            result = original(*args, **kwargs)
        finally:  # a loader that raises (an index past the rank's rows) must not leave the mark behind
            written = param.data.view(torch.uint8) != _MARK
            param.data.view(torch.uint8).copy_(torch.where(written, param.data.view(torch.uint8),
                                                           before.view(torch.uint8)))
        if result is not False:
            rows = written.reshape(param.shape[0], -1).any(dim=1) if param.dim() else written.reshape(-1).any(0, True)
            strays.append((name, expert, tuple(int(r) for r in torch.nonzero(rows).flatten())))
        return result
    return recording


def _audit(shared: _Shared, backend: str, known: tuple[tuple[str, ...], bool], rank: int) -> AuditReport:
    """The audit of every layer against this backend's reads, each finding named by rank and global expert."""
    reads = frozenset(known[0])
    reports = [one.measure(backend, reads, known[1]) for one in shared.loaded]
    experts = shared.facts.experts

    def named(f: Finding) -> Finding:
        rows = tuple(sorted(experts[r] for r in f.experts if 0 <= r < len(experts) and experts[r] >= 0))
        return dataclasses.replace(f, experts=rows if f.param not in shared.global_params else f.experts, rank=rank)

    return AuditReport(backend, reads, tuple(named(f) for r in reports for f in r.findings),
                       frozenset(n for r in reports for n in r.loaded))


def _kernel(path: Path, capability: tuple[int, int]) -> KernelFormat:
    """vLLM's conversion of a freshly built and loaded first block (conversion rewrites the parameters)."""
    build = layers.build(path, capability)
    assert build.layer is not None  # the same build just succeeded for this arch
    sentinel.load_accepted(build.layer, sentinel.checkpoint_tensors(path, build.layer.prefix)())
    return kernel.kernel_format(build.layer)
