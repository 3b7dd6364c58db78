"""vLLM's config resolution, fed with a checkpoint directory: which quantization method and scheme it picks."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from quantmatrix.adapter import mixed
from quantmatrix.adapter.declared import FP8_FAMILIES, INT_ACT_SCHEMES, MODELOPT_ALGOS, MODELOPT_FAMILIES, MXFP8
from quantmatrix.adapter.versions import versions
from quantmatrix.errors import AdapterMismatch

# What config resolution imports, for the vLLM health check (adapter.health): the entry points below and the quant
# config modules that vLLM's get_quantization_config imports lazily (where a broken flashinfer first shows).
QUANT_MODULES = (
    "vllm.model_executor.layers.quantization.modelopt",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors",
    "vllm.model_executor.layers.quantization.fp8",
    "vllm.model_executor.layers.quantization.mxfp4",
)
MODULES = ("vllm.config", "vllm.model_executor.model_loader.weight_utils", "vllm.model_executor.layers.quantization",
           *QUANT_MODULES, *mixed.MIXED_MODULES)
# The quant methods the matrices' checkpoints resolve to; the health check asks vLLM for each one's class.
METHODS = ("modelopt", "modelopt_fp4", "modelopt_mixed", "modelopt_mxfp8", "compressed-tensors", "fp8",
           "gpt_oss_mxfp4")
# vLLM's integer weight-only configs (0.32: auto_gptq.py / auto_awq.py, Marlin with the moe_wna16 fallback): the
# attributes that name the variant they resolved to.
_WNA16_CONFIGS = {"AutoGPTQConfig": "GPTQ", "AutoAWQConfig": "AWQ"}
# vLLM's MXFP4 configs (0.32: quantization/mxfp4.py; gpt-oss's `quant_method: mxfp4` resolves to gpt_oss_mxfp4 when
# the model_type is gpt_oss). One scheme whatever the arch: the MoE backend decides bf16 or MXFP8 activations.
_MXFP4_CONFIGS = ("GptOssMxfp4Config", "Mxfp4Config")

# ModelOpt configs carry the scheme in `quant_method` (a ModelOpt quant_algo string), one table for the config
# files and vLLM's resolved configs (adapter.declared): the NVFP4 algos, and the FP8 ones (ModelOptFp8Config);
# MXFP8 has a config class of its own (ModelOptMxFp8Config).
_MODELOPT_ALGOS = {algo: word for algo, word in MODELOPT_ALGOS.items() if word not in MODELOPT_FAMILIES}
_MODELOPT_FP8_ALGOS = {algo: word for algo, word in MODELOPT_ALGOS.items() if word in FP8_FAMILIES}


@dataclasses.dataclass(frozen=True)
class Resolution:
    """What vLLM's real config resolution decided for one checkpoint."""

    method: str  # vLLM's quantization method name ("modelopt_fp4", "compressed-tensors", "none")
    config_class: str
    algo: str  # vLLM's own name for the scheme (e.g. W4A16_NVFP4), for the reader
    scheme: str  # behaviour: a schema.vocab.RESOLUTIONS word (weight_only | w4a4 | fp8_static | ... | rejected)
    detail: str = ""
    # MIXED_PRECISION: every linear module outside the experts, as its map declares it and as vLLM builds it
    projections: tuple[mixed.Projection, ...] = ()


def entry_points() -> tuple[Any, Any, Any]:
    """(ModelConfig, LoadConfig, get_quant_config), or AdapterMismatch when vLLM moved them."""
    try:
        from vllm.config import LoadConfig, ModelConfig
        from vllm.model_executor.model_loader.weight_utils import get_quant_config
    except ImportError as e:
        raise AdapterMismatch(f"vLLM {versions()['vllm_version']}: config resolution entry points moved "
                              f"({e}); update quantmatrix/adapter/config.py") from e
    return ModelConfig, LoadConfig, get_quant_config


def model_config(checkpoint_dir: Path) -> Any:
    """vLLM's ModelConfig of a checkpoint directory (no tokenizer, bf16)."""
    ModelConfig, _, _ = entry_points()
    return ModelConfig(model=str(checkpoint_dir), skip_tokenizer_init=True, dtype="bfloat16")


def resolve(checkpoint_dir: Path) -> Resolution:
    """Feed the checkpoint through vLLM's own path: ModelConfig picks the method (override_quantization_method,
    hf_quant_config.json lookup), get_quant_config builds it with from_config. Nothing is re-implemented."""
    _, LoadConfig, get_quant_config = entry_points()
    try:
        mc = model_config(checkpoint_dir)
        if mc.quantization is None:
            return Resolution("none", "", "", "unquantized", "vLLM found no quantization config")
        config = get_quant_config(mc, LoadConfig())
    except (ValueError, NotImplementedError) as e:
        # vLLM refuses a config with these (pydantic's ValidationError is a ValueError); anything else it raises
        # (KeyError, TypeError, AssertionError, ...) is a crash and stays an error, never a "rejection".
        return Resolution("?", "", "", "rejected", reason(e))
    algo, scheme = classify(config)
    projections = mixed.projections(config, mc) if type(config).__name__ == "ModelOptMixedPrecisionConfig" else ()
    return Resolution(config.get_name(), type(config).__name__, algo, scheme, projections=projections)


def reason(error: Exception) -> str:
    """vLLM's own words, without pydantic's wrapping around them; where it has none (a bare `assert`), the line of
    vLLM that raised."""
    errors = getattr(error, "errors", None)
    if callable(errors):
        return "; ".join(str(e.get("msg", e)) for e in errors())
    if not str(error) and error.__traceback__ is not None:
        import traceback

        frame = traceback.extract_tb(error.__traceback__)[-1]
        where = frame.filename[frame.filename.rfind("vllm/"):] if "vllm/" in frame.filename else frame.filename
        return f"{type(error).__name__} at {where}:{frame.lineno}: {frame.line}"
    return f"{type(error).__name__}: {error}"


def _classify_mixed(config: Any) -> tuple[str, str]:
    """ModelOpt MIXED_PRECISION picks an algo per layer; what matters here is the one its MoE experts get (the
    seed bug's shape: W4A16_NVFP4 experts beside FP8 attention)."""
    layers = getattr(config, "quantized_layers", None)
    if not isinstance(layers, dict):
        raise AdapterMismatch("ModelOptMixedPrecisionConfig has no quantized_layers dict: update "
                              "quantmatrix/adapter/config.py")
    algos = {str(r.get("quant_algo", "")).upper() for p, r in layers.items() if "experts" in p}
    if not algos:
        return "MIXED_PRECISION, no expert layer quantized", "unquantized"
    if len(algos) > 1 or next(iter(algos)) not in _MODELOPT_ALGOS:
        raise AdapterMismatch(f"MIXED_PRECISION experts use {sorted(algos)}; quantmatrix knows one of "
                              f"{sorted(_MODELOPT_ALGOS)}: update quantmatrix/adapter/config.py")
    algo = next(iter(algos))
    return f"MIXED_PRECISION experts {algo}", _MODELOPT_ALGOS[algo]


def _fp8_words(block: bool, dynamic: bool) -> str:
    return "fp8_block" if block else "fp8_dynamic" if dynamic else "fp8_static"


def _type(args: Any) -> str:
    """A QuantizationArgs' type as the config writes it ("int", "float"), whichever way pydantic keeps it."""
    return str(getattr(args, "type", "")).rsplit(".", 1)[-1].lower()


def _classify_ct(linear: Any) -> tuple[str, str]:
    """A compressed-tensors Linear target: integer weights without activations are WNA16, with 8-bit activations
    W8A8 INT8 or W4A8 FP8 (adapter.declared.INT_ACT_SCHEMES), 8-bit float weights are FP8 (block, or by the
    activations' `dynamic`), anything else NVFP4 by whether activations are quantized."""
    weights, acts = linear.get("weights"), linear.get("input_activations")
    if _type(weights) == "int" and acts is None:
        return (f"W{weights.num_bits}A16 (int {weights.strategy}, group_size {weights.group_size}, "
                f"{'symmetric' if weights.symmetric else 'zero points'})", "weight_only")
    kind = INT_ACT_SCHEMES.get((getattr(weights, "num_bits", None), _type(acts), getattr(acts, "num_bits", None)))
    if _type(weights) == "int" and kind is not None:
        return (f"W{weights.num_bits}A{acts.num_bits} (int {weights.strategy} weights, group_size "
                f"{weights.group_size}; {_type(acts)} {acts.strategy} activations, "
                f"{'dynamic' if acts.dynamic else 'static'})", kind[0])
    if weights is not None and getattr(weights, "num_bits", None) == 8 and str(getattr(weights, "type", "")) in (
            "float", "QuantizationType.FLOAT"):
        strategy = str(getattr(weights, "strategy", ""))
        dynamic = acts is not None and bool(getattr(acts, "dynamic", False))
        return f"FP8 (weights {strategy.rsplit('.', 1)[-1]}, activations {'dynamic' if dynamic else 'static'})", \
            _fp8_words(strategy.endswith("block"), dynamic)
    if acts is None:
        return "NVFP4A16 (input_activations None)", "weight_only"
    return "NVFP4 (input_activations set)", "w4a4"


def classify(config: Any) -> tuple[str, str]:
    """(vLLM's scheme name, behaviour) of a resolved quantization config."""
    name = type(config).__name__
    if name == "ModelOptFp8Config":
        algo = str(getattr(config, "quant_method", ""))
        if algo not in _MODELOPT_FP8_ALGOS:
            raise AdapterMismatch(f"ModelOptFp8Config.quant_method is {algo!r}; quantmatrix knows "
                                  f"{sorted(_MODELOPT_FP8_ALGOS)}: update quantmatrix/adapter/config.py")
        return algo, _MODELOPT_FP8_ALGOS[algo]
    if name == "ModelOptMxFp8Config":
        return f"{getattr(config, 'quant_method', '')} (E4M3 blocks of 32, E8M0 scales)", MXFP8
    if name == "Fp8Config":
        block, scheme = getattr(config, "weight_block_size", None), getattr(config, "activation_scheme", None)
        if scheme not in ("static", "dynamic"):
            raise AdapterMismatch(f"Fp8Config.activation_scheme is {scheme!r}: update quantmatrix/adapter/config.py")
        return f"fp8 activation_scheme {scheme}, weight_block_size {block}", \
            _fp8_words(block is not None, scheme == "dynamic")
    if name == "ModelOptNvFp4Config":
        algo = getattr(config, "quant_method", None)
        if algo not in _MODELOPT_ALGOS:
            raise AdapterMismatch(f"ModelOptNvFp4Config.quant_method is {algo!r}; quantmatrix knows "
                                  f"{sorted(_MODELOPT_ALGOS)}: update quantmatrix/adapter/config.py")
        return algo, _MODELOPT_ALGOS[algo]
    if name == "ModelOptMixedPrecisionConfig":
        return _classify_mixed(config)
    if name in _WNA16_CONFIGS:
        quant_type, group = getattr(config, "quant_type", None), getattr(config, "group_size", None)
        if quant_type is None or group is None:
            raise AdapterMismatch(f"{name} has no quant_type / group_size: update quantmatrix/adapter/config.py")
        return f"{_WNA16_CONFIGS[name]} {quant_type} group_size {group}", "weight_only"
    if name in _MXFP4_CONFIGS:
        return f"{config.get_name()} (E2M1 blocks of 32, E8M0 scales)", "mxfp4"
    if name == "CompressedTensorsConfig":
        scheme_map = getattr(config, "target_scheme_map", None)
        if not isinstance(scheme_map, dict):
            raise AdapterMismatch("CompressedTensorsConfig has no target_scheme_map dict: update "
                                  "quantmatrix/adapter/config.py")
        linear = scheme_map.get("Linear")
        if linear is None:
            return "no Linear target", "unquantized"
        return _classify_ct(linear)
    raise AdapterMismatch(f"quantization config class {name} ({config.get_name()}) is not one quantmatrix "
                          "can classify: update quantmatrix/adapter/config.py")
