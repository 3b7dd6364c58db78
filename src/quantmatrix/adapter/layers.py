"""vLLM's own MoE blocks built on a CPU host for a checkpoint, under a simulated capability, and fed through
vLLM's own weight loaders: what the layer-level checks (dispatch, audit, kernel format) look at."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from quantmatrix.adapter import config, families, gpt_oss, parallel, simulate
from quantmatrix.adapter.versions import Span, pick
from quantmatrix.errors import AdapterMismatch

# model_type -> (module, block class, submodule name of the MoE block in a decoder layer)
_MOE_BLOCKS = {
    "qwen3_moe": ("vllm.model_executor.models.qwen3_moe", "Qwen3MoeSparseMoeBlock", "mlp"),
    "mixtral": ("vllm.model_executor.models.mixtral", "MixtralMoE", "block_sparse_moe"),
    "gpt_oss": ("vllm.model_executor.models.gpt_oss", "MLPBlock", "mlp"),
}
_PRE_IMPORTS = (
    *config.QUANT_MODULES,
    "vllm.model_executor.layers.quantization.online.base",
    "vllm.model_executor.models.utils",
    *(m for m, _, _ in _MOE_BLOCKS.values()),
)
# Where each NVFP4 MoE method keeps its own weight-only view, `use_a16`, per vLLM release: an attribute, or
# (compressed-tensors before 0.29) only the constructor argument its backend oracle was given, recorded at build.
_CT_NVFP4_MOE = ("vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
                 "compressed_tensors_moe_w4a4_nvfp4")
_USE_A16 = {
    "ModelOptNvFp4FusedMoE": (Span("attribute"),),
    "CompressedTensorsW4A4Nvfp4MoEMethod": (Span(("argument", _CT_NVFP4_MOE), before="0.29.0"),
                                            Span("attribute", since="0.29.0")),
}
_RECORDED = "_quantmatrix_use_a16"
# What building a layer imports, for the vLLM health check (adapter.health): the above, the parallel groups and
# the platform the capability simulation patches.
MODULES = (*_PRE_IMPORTS, "vllm.distributed", "vllm.platforms", "vllm.utils.torch_utils")


@dataclasses.dataclass
class MoELayer:
    """One real vLLM MoE block (router + RoutedExperts) built for a checkpoint under a simulated arch."""

    block: Any  # torch.nn.Module
    experts: Any  # vLLM's RoutedExperts
    prefix: str  # checkpoint prefix of the block, e.g. "model.layers.0.mlp."
    method: str  # MoE quant-method class
    backend: str  # MoE kernel backend vLLM selected
    weight_only: bool  # the method's own view: activations unquantized (use_a16)
    vllm_config: Any
    num_experts: int
    simulated_without: tuple[str, ...] = ()  # optional kernel packages hidden from vLLM (simulate.without)
    scheme: str = ""  # what the method runs, in the matrix's resolves_to words (adapter.families)

    def parameters(self) -> dict[str, Any]:
        return dict(self.block.named_parameters())

    def padding(self) -> dict[str, tuple[int, ...]]:
        """Per padded fused parameter, the corner of an expert row the loader fills (the rest is vLLM's zeros):
        gpt-oss's MXFP4 rounds hidden and intermediate up for its kernel (adapter.gpt_oss.corners)."""
        if not gpt_oss.owns(self.block):
            return {}
        hf = self.vllm_config.model_config.hf_config
        return {self.prefix + n: c for n, c in gpt_oss.corners(self.block, self.experts, hf).items()}

    @property
    def hidden_size(self) -> int:
        """The width of the hidden states the block takes (tokens x hidden_size)."""
        return int(self.vllm_config.model_config.get_hidden_size())

    def load(self, tensors: Iterable[tuple[str, Any]]) -> set[str]:
        """Feed checkpoint tensors (checkpoint names) through vLLM's own loader and weight_loaders."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.models.utils import AutoWeightsLoader

        mine = [(name, t) for name, t in tensors if name.startswith(self.prefix)]
        local = [(name[len(self.prefix):], t) for name, t in mine]
        with set_current_vllm_config(self.vllm_config), simulate.without(self.simulated_without):
            if gpt_oss.owns(self.block):  # its fused tensors load through GptOssModel's own loader
                return gpt_oss.load(self.block, self.prefix, self.vllm_config, mine)
            return set(AutoWeightsLoader(self.block).load_weights(local))


_distributed_ready = False


def _ensure_distributed(model_config: Any) -> None:
    """A world-size-1 gloo group, once per process: vLLM's MoE layers read their parallel groups at build (a rank
    process has its own, adapter.parallel). Made on the CPU platform, before the capability simulation: under it
    vLLM would pick a CUDA device communicator for the group."""
    global _distributed_ready
    if _distributed_ready or parallel.active():
        return
    import tempfile

    from vllm.config import DeviceConfig, LoadConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    init_file = tempfile.NamedTemporaryFile(prefix="quantmatrix-gloo-", delete=False).name
    vllm_config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"),
                             load_config=LoadConfig())
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{init_file}")
        initialize_model_parallel(1, 1)
    _distributed_ready = True


def prepare(checkpoint_dir: Path) -> Any:
    """Import everything capability-sensitive and parse the model config BEFORE the platform is patched."""
    import importlib

    for module in _PRE_IMPORTS:
        importlib.import_module(module)
    return config.model_config(checkpoint_dir)


def build_moe_layer(model_config: Any, layer_index: int = 0, moe_backend: str = "auto") -> MoELayer:
    """Build the MoE block vLLM's model class builds for this checkpoint; call inside simulate.simulate.
    `moe_backend`: vLLM's own backend override (its `--moe-backend`), "auto" for the oracle's choice."""
    import importlib

    import torch
    from vllm.config import DeviceConfig, LoadConfig, VllmConfig, set_current_vllm_config
    from vllm.utils.torch_utils import set_default_torch_dtype

    hf = model_config.hf_text_config
    spec = _MOE_BLOCKS.get(hf.model_type)
    if spec is None:
        raise AdapterMismatch(f"no MoE block known for model_type {hf.model_type!r}; known: {sorted(_MOE_BLOCKS)}")
    module, cls_name, sub = spec
    block_cls = getattr(importlib.import_module(module), cls_name)
    prefix = f"model.layers.{layer_index}.{sub}"
    forced = {} if moe_backend == "auto" else {"kernel_config": _kernel_config(moe_backend)}
    vllm_config = parallel.adopt(VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"),
                                            load_config=LoadConfig(), **forced))
    with set_current_vllm_config(vllm_config), set_default_torch_dtype(torch.bfloat16):
        if cls_name == "MixtralMoE":
            block = block_cls(num_experts=hf.num_local_experts, top_k=hf.num_experts_per_tok,
                              hidden_size=hf.hidden_size, intermediate_size=hf.intermediate_size,
                              quant_config=vllm_config.quant_config, prefix=prefix)
        elif cls_name == "MLPBlock":  # gpt-oss's block takes its layer index
            block = block_cls(vllm_config=vllm_config, layer_idx=layer_index, prefix=prefix)
        else:
            block = block_cls(vllm_config=vllm_config, prefix=prefix)
    # RoutedExperts or a model's own subclass of it (gpt-oss: GptOssRoutedExperts)
    experts = next((m for m in block.modules() if "RoutedExperts" in {c.__name__ for c in type(m).__mro__}), None)
    if experts is None:
        raise AdapterMismatch(f"{cls_name} holds no RoutedExperts module: the MoE layer API moved")
    method = experts.quant_method
    reading = families.read(method, _method_weight_only)
    return MoELayer(block, experts, prefix + ".", type(method).__name__, reading.backend, reading.weight_only,
                    vllm_config, experts.moe_config.num_experts, scheme=reading.scheme)


def _kernel_config(moe_backend: str) -> Any:
    """vLLM's own MoE backend override (KernelConfig.moe_backend, `--moe-backend`); only asked for when forcing, so
    a release without it still builds the oracle's choice."""
    try:
        from vllm.config import KernelConfig

        return KernelConfig(moe_backend=moe_backend)
    except (ImportError, TypeError) as e:
        raise AdapterMismatch(f"vLLM has no KernelConfig(moe_backend=...) ({e}): update quantmatrix/adapter/"
                              "layers.py") from e


def moe_layer_indices(model_config: Any) -> list[int]:
    """Decoder layers whose MLP is a routed MoE block (Qwen3-MoE may keep some dense: mlp_only_layers)."""
    hf = model_config.hf_text_config
    dense = set(getattr(hf, "mlp_only_layers", None) or ())
    step = getattr(hf, "decoder_sparse_step", 1) or 1
    return [i for i in range(hf.num_hidden_layers) if i not in dense and (i + 1) % step == 0]


def _method_weight_only(method: Any) -> bool:
    """ModelOptNvFp4FusedMoE and CompressedTensorsW4A4Nvfp4MoEMethod both say it with `use_a16` (_USE_A16)."""
    name = type(method).__name__
    where = pick(f"where {name} keeps use_a16", _USE_A16.get(name, (Span("attribute"),)), "layers.py")
    attr = "use_a16" if where == "attribute" else _RECORDED
    if not hasattr(method, attr):
        raise AdapterMismatch(f"MoE method {name} has no {attr}: update quantmatrix/adapter/layers.py")
    return bool(getattr(method, attr))


@contextlib.contextmanager
def _recording_use_a16() -> Iterator[None]:
    """Where a method keeps use_a16 only as a constructor argument, record the argument vLLM passed it."""
    patched = []
    for name, spans in _USE_A16.items():
        where = pick(f"where {name} keeps use_a16", spans, "layers.py")
        if where == "attribute":
            continue
        cls = getattr(importlib.import_module(where[1]), name)
        original = cls.__dict__["__init__"]
        signature = inspect.signature(original)

        def init(self: Any, *args: Any, _original: Any = original, _signature: Any = signature, **kwargs: Any) -> None:
            _original(self, *args, **kwargs)
            bound = _signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            setattr(self, _RECORDED, bound.arguments["use_a16"])

        cls.__init__ = init
        patched.append((cls, original))
    try:
        yield
    finally:
        for cls, original in patched:
            cls.__init__ = original


@dataclasses.dataclass(frozen=True)
class Built:
    """What vLLM chose for a MoE block built in another process (a rank's, measure.ranks), as data."""

    method: str
    backend: str
    weight_only: bool
    scheme: str = ""


@dataclasses.dataclass
class LayerBuild:
    """A built MoE layer, or why vLLM refused to build it (refusing can be the expected outcome)."""

    layer: MoELayer | Built | None
    error: str | None
    layers: list[MoELayer] = dataclasses.field(default_factory=list)  # every MoE layer, when asked for
    simulated_without: tuple[str, ...] = ()  # optional kernel packages hidden from vLLM for this build


def build(checkpoint_dir: Path, capability: tuple[int, int] | None, every_layer: bool = False,
          moe_backend: str = "auto") -> LayerBuild:
    """vLLM's own MoE block for the checkpoint (the first, or every one), built as on `capability` (None: on this
    host's own platform, unsimulated), with the backend vLLM's oracle picks or the one `moe_backend` forces."""
    try:
        model_config = prepare(checkpoint_dir)
        indices = moe_layer_indices(model_config)
        layers = _simulated_build(model_config, capability, indices if every_layer else indices[:1], moe_backend)
        return LayerBuild(layers[0], None, layers, layers[0].simulated_without)
    except AdapterMismatch:
        raise
    except (ValueError, NotImplementedError, RuntimeError, KeyError, TypeError, AssertionError) as e:
        # AssertionError: vLLM 0.28's MoeWNA16Method asserts what it cannot build (8-bit needs group_size -1)
        return LayerBuild(None, config.reason(e), simulated_without=simulate.unusable())


def _simulated_build(model_config: Any, capability: tuple[int, int] | None, indices: list[int],
                     moe_backend: str = "auto") -> list[MoELayer]:
    """The layers built under the simulated capability. An optional kernel package whose own code raised (it
    cannot initialise here) is hidden from vLLM and the build repeated, so the backend is vLLM's choice without it."""
    _ensure_distributed(model_config)
    while True:
        hidden = simulate.unusable()
        try:
            platform = simulate.simulate(capability) if capability is not None else contextlib.nullcontext()
            with platform, simulate.without(hidden), _recording_use_a16():
                built = [build_moe_layer(model_config, i, moe_backend) for i in indices]
        except Exception as e:
            package = simulate.implicated(e)
            if package is None or package in hidden:
                raise
            simulate.note_unusable(package, e)
            continue
        for layer in built:
            layer.simulated_without = hidden
        return built
