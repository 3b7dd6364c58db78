"""What a checkpoint's quantization config declares about its activations, read the way vLLM reads it: the one
classifier the lint, the config-dispatch case and the production guard share.

vLLM (0.28 to 0.32, measured in tests/test_declared_vllm.py) reads config.json's `quantization_config`, else the
legacy hf_quant_config.json, and decides:
- ModelOpt (`quant_method` starting with "modelopt", any case): `quant_algo` upper-cased; W4A16_NVFP4 is
  weight-only; NVFP4 is promoted to weight-only only when `config_groups` is a non-empty mapping whose every group
  is a mapping with `input_activations` None or absent (ModelOptNvFp4Config._from_config); else W4A4.
- compressed-tensors: a group quantizes activations when its `input_activations` is truthy (an empty mapping,
  null or no key is weight-only: CompressedTensorsConfig._quantization_scheme_map_from_config); no group at all
  quantizes nothing (every Linear gets UnquantizedLinearMethod). float-quantized (FP8) groups: block weights are
  block-wise FP8, else the activations' `dynamic` decides static or dynamic. Format `pack-quantized` with int
  weights and no activation quantization is integer weight-only (WNA16). Int weights with quantized activations:
  8-bit weights and int8 activations (format `int-quantized`) are W8A8 INT8, 4-bit weights with 8-bit float
  activations (`pack-quantized`, the W4AFP8 preset) W4A8 FP8 (CompressedTensorsConfig._is_dynamic_token_w8a8,
  _is_fp8_w4a8).
- fp8 (Fp8Config): `weight_block_size` is block-wise FP8, else `activation_scheme` static or dynamic.
- ModelOpt MXFP8 (`quant_algo` MXFP8): E4M3 weights, an E8M0 scale per 32 inputs, bf16 activations
  (ModelOptMxFp8Config; its MoE reads weight and weight_scale only).
- mxfp4 (gpt-oss): MXFP4 experts; Mxfp4Config.from_config reads no other key (not `modules_to_not_convert`).
- GPTQ / AWQ (`quant_method` gptq / awq): integer weight-only, `bits`, `group_size` (-1: channel-wise), GPTQ's
  `desc_act` (activation order) and `sym`, AWQ's `zero_point`.
Pure data in, data out: no vLLM import, so the lint reads a checkpoint with no vLLM installed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from quantmatrix.errors import AdapterMismatch

# ModelOpt's quant_algo values, as vLLM upper-cases them, and what each declares before any promotion.
MODELOPT_ALGOS = {"NVFP4": "w4a4", "W4A16_NVFP4": "weight_only", "FP8": "fp8_static",
                  "FP8_PER_CHANNEL_PER_TOKEN": "fp8_dynamic", "FP8_PB_WO": "fp8_block", "MXFP8": "mxfp8"}
# ModelOpt's per-module algo: `quantized_layers` maps module names to one of MODELOPT_ALGOS each (the family of
# such a declaration is MIXED, whose modules each hold their own algo's tensors).
MIXED_ALGO, MIXED = "MIXED_PRECISION", "mixed"
CT_NVFP4_FORMAT = "nvfp4-pack-quantized"
CT_FP8_FORMAT = "float-quantized"
CT_WNA16_FORMAT = "pack-quantized"
CT_INT_FORMAT = "int-quantized"  # unpacked integer weights beside quantized activations (W8A8 INT8)
# The scheme module (checkpoints.schemes) whose tensors an FP8 reading names; any other reading of ModelOpt,
# compressed-tensors float-quantized or fp8 (NVFP4, unquantized, unknown) is an NVFP4 one.
FP8_FAMILIES = {"fp8_static": "fp8", "fp8_dynamic": "fp8", "fp8_block": "fp8_block"}
# MXFP8 (ModelOptMxFp8Config: E4M3 weights, E8M0 scales per 32 inputs) is its own family and scheme module.
MXFP8 = "mxfp8"
MODELOPT_FAMILIES = {**FP8_FAMILIES, MXFP8: MXFP8}  # a ModelOpt reading's family beside NVFP4 (the default)
# Int weights with quantized activations (compressed-tensors): (weight bits, activation type, activation bits) ->
# (resolves_to word, scheme module whose tensors it holds, the format that stores them)
INT_ACT_SCHEMES = {(8, "int", 8): ("w8a8_int8", "int8", CT_INT_FORMAT),
                   (4, "float", 8): ("w4a8_fp8", "w4a8", CT_WNA16_FORMAT)}
MXFP4_METHOD = "mxfp4"  # gpt-oss's quant_method: MXFP4 experts, the config names nothing else vLLM reads
WNA16_METHODS = ("gptq", "awq")  # quant_methods that are integer weight-only whatever their other keys say


@dataclasses.dataclass(frozen=True)
class IntWeights:
    """An integer weight-only config's weights: what the packed tensors' shapes and values must agree with."""

    bits: int
    group_size: int  # -1: one group per output channel
    actorder: bool  # groups formed in activation order: a g_idx tensor says which group each input is in
    symmetric: bool  # no zero points of the checkpoint's own


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def gptq_awq_weights(qc: Mapping[str, Any], producer: str) -> IntWeights:
    """GPTQ's bits / group_size / desc_act / sym, AWQ's bits / group_size / zero_point (missing keys: the
    producers' defaults, 4 bits and groups of 128)."""
    bits, group = _int(qc.get("bits", qc.get("w_bit")), 4), _int(qc.get("group_size", qc.get("q_group_size")), 128)
    if producer == "awq":
        return IntWeights(bits, group, False, qc.get("zero_point", True) is False)
    return IntWeights(bits, group, qc.get("desc_act") is True, qc.get("sym", True) is not False)


def ct_int_weights(group: Any) -> IntWeights | None:
    """A compressed-tensors group's int weights (strategy channel: group_size -1), None for any other weights."""
    weights = group.get("weights") if isinstance(group, Mapping) else None
    if not isinstance(weights, Mapping) or weights.get("type") != "int":
        return None
    size = -1 if weights.get("strategy") == "channel" else _int(weights.get("group_size"), -1)
    return IntWeights(_int(weights.get("num_bits"), 4), size, weights.get("actorder") == "group",
                      weights.get("symmetric", True) is not False)


def group_activations(group: Any) -> str:
    """One config group's input_activations: null, missing, empty, quantized, not-a-mapping (the group itself),
    or `unexpected <type>` (a value that is neither None nor a mapping)."""
    if not isinstance(group, Mapping):
        return "not-a-mapping"
    if "input_activations" not in group:
        return "missing"
    acts = group["input_activations"]
    if acts is None:
        return "null"
    if isinstance(acts, Mapping):
        return "quantized" if acts else "empty"
    return f"unexpected {type(acts).__name__}"


def _modelopt_says_none(group: Any) -> bool:
    """ModelOptNvFp4Config._from_config: `isinstance(group, dict) and group.get("input_activations") is None`."""
    return isinstance(group, Mapping) and group.get("input_activations") is None


def _ct_quantizes(group: Any) -> bool:
    """compressed-tensors: a truthy input_activations is validated as activation quantization args."""
    return isinstance(group, Mapping) and bool(group.get("input_activations"))


def _ct_fp8(groups: Mapping[str, Any]) -> str:
    """A float-quantized config's FP8 kind, from its first group (vLLM reads every group alike)."""
    group = next(iter(groups.values()))
    weights = group.get("weights") if isinstance(group, Mapping) else None
    acts = group.get("input_activations") if isinstance(group, Mapping) else None
    if isinstance(weights, Mapping) and weights.get("strategy") == "block":
        return "fp8_block"
    return "fp8_dynamic" if isinstance(acts, Mapping) and acts.get("dynamic") else "fp8_static"


def _ct_int_acts(groups: Mapping[str, Any]) -> tuple[str, str, str, IntWeights] | None:
    """A compressed-tensors config whose every group has int weights and quantized activations of one
    INT_ACT_SCHEMES kind: (word, scheme module, format, weights); None otherwise."""
    kinds = set()
    for g in groups.values():
        w, acts = ct_int_weights(g), g.get("input_activations") if isinstance(g, Mapping) else None
        if w is None or not isinstance(acts, Mapping) or not acts:
            return None
        kinds.add((w, (w.bits, acts.get("type"), acts.get("num_bits"))))
    if len(kinds) != 1:
        return None
    w, key = kinds.pop()
    return (*INT_ACT_SCHEMES[key], w) if key in INT_ACT_SCHEMES else None


@dataclasses.dataclass(frozen=True)
class Declaration:
    """A quantization config in vLLM's reading.

    `producer`: modelopt | compressed-tensors | none (no quant_method: vLLM reads no quantization) | the
    quant_method as written (one vLLM's NVFP4 readers do not claim). `scheme`: weight_only | w4a4 | unquantized, or
    None where the config is not NVFP4 (`algo` / `format` say what it is instead). `groups`: each config group's
    input_activations (group_activations), in order; `groups_shape` is "present", "empty", "missing" or "a <type>"
    (config_groups that is not a mapping).
    `disagree`: the groups differ on the one question the producer's rule asks."""

    producer: str
    scheme: str | None
    algo: str | None = None
    format: str | None = None
    groups: tuple[tuple[str, str], ...] = ()
    groups_shape: str = "missing"
    disagree: bool = False
    family: str = "nvfp4"  # the scheme module whose tensors the checkpoint holds (checkpoints.schemes): nvfp4,
    # fp8 / fp8_block (FP8_FAMILIES), wna16, int8 / w4a8 (INT_ACT_SCHEMES)
    weights: IntWeights | None = None  # integer weight-only: the declared bits, groups, order, zero points
    layers: tuple[tuple[str, str], ...] = ()  # MIXED_PRECISION: (module, upper-cased quant_algo) of quantized_layers

    def groups_text(self) -> str:
        """`g input_activations null, h input_activations quantized`, or what stands in for the groups."""
        if self.groups:
            return ", ".join(f"{name} input_activations {acts}" for name, acts in self.groups)
        if self.groups_shape in ("missing", "empty"):
            return f"config_groups {self.groups_shape}"
        return f"config_groups is {self.groups_shape}"


def _groups(qc: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    if "config_groups" not in qc:
        return {}, "missing"
    groups = qc["config_groups"]
    if groups is not None and not isinstance(groups, Mapping):
        return {}, f"a {type(groups).__name__}"
    return dict(groups or {}), "present" if groups else "empty"


def producer_of(qc: Mapping[str, Any]) -> str:
    """Which of vLLM's readers claims the config: its quant_method lower-cased (compressed_tensors spelled with
    a dash, every modelopt* method as modelopt); no method at all is none."""
    method = str(qc.get("quant_method", "") or "").lower().replace("compressed_tensors", "compressed-tensors")
    if method.startswith("modelopt"):
        return "modelopt"
    return method or "none"


def modelopt_algo(qc: Mapping[str, Any]) -> str | None:
    """ModelOpt's quant_algo, upper-cased as vLLM reads it: the legacy file's `quantization.quant_algo`, else the
    config's own; None when there is none."""
    inner = qc.get("quantization")
    algo = inner.get("quant_algo") if isinstance(inner, Mapping) else qc.get("quant_algo")
    return str(algo).upper() if algo else None


def mixed_layers(qc: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """ModelOptMixedPrecisionConfig._from_config's `quantized_layers` (the legacy file's under `quantization`):
    (module, quant_algo upper-cased) per entry; an entry that is not a mapping has algo ""."""
    inner = qc.get("quantization")
    layers = (inner if isinstance(inner, Mapping) else qc).get("quantized_layers")
    if not isinstance(layers, Mapping):
        return ()
    return tuple((str(m), str(r.get("quant_algo", "")).upper() if isinstance(r, Mapping) else "")
                 for m, r in layers.items())


def mixed_scheme(layers: tuple[tuple[str, str], ...]) -> str | None:
    """What a MIXED_PRECISION MoE runs: its experts' algo (one for all), unquantized when no expert is listed, None
    when the experts' algos differ or are unknown."""
    algos = {a for m, a in layers if ".experts." in f"{m}."}
    if not algos:
        return "unquantized"
    return MODELOPT_ALGOS.get(next(iter(algos))) if len(algos) == 1 else None


def declare(qc: Mapping[str, Any] | None, legacy: bool = False) -> Declaration:
    """vLLM's reading of one quantization config: config.json's quantization_config, or (`legacy`) the whole
    hf_quant_config.json, ModelOpt's own file (vLLM looks for config_groups at its top level too)."""
    if qc is None:
        return Declaration("none", "unquantized")
    groups, shape = _groups(qc)
    acts = tuple((str(name), group_activations(g)) for name, g in groups.items())
    producer = "modelopt" if legacy else producer_of(qc)
    if producer == "modelopt" and modelopt_algo(qc) == MIXED_ALGO:
        layers = mixed_layers(qc)
        return Declaration(producer, mixed_scheme(layers), MIXED_ALGO, None, acts, shape, family=MIXED, layers=layers)
    if producer == "modelopt":
        algo = modelopt_algo(qc)
        says_none = [_modelopt_says_none(g) for g in groups.values()]
        scheme = MODELOPT_ALGOS.get(algo or "")
        if algo == "NVFP4" and says_none and all(says_none):
            scheme = "weight_only"
        return Declaration(producer, scheme, algo, None, acts, shape, any(says_none) and not all(says_none),
                           MODELOPT_FAMILIES.get(scheme or "", "nvfp4"))
    if producer == "compressed-tensors" and qc.get("format") == CT_FP8_FORMAT:
        scheme = _ct_fp8(groups) if groups else "unquantized"
        return Declaration(producer, scheme, None, CT_FP8_FORMAT, acts, shape,
                           family=FP8_FAMILIES.get(scheme, "nvfp4"))
    if producer == "fp8":
        block, scheme = qc.get("weight_block_size"), qc.get("activation_scheme")
        fp8 = "fp8_block" if block else {"static": "fp8_static", "dynamic": "fp8_dynamic"}.get(str(scheme))
        return Declaration(producer, fp8, None, None, acts, shape, family=FP8_FAMILIES.get(fp8 or "", "nvfp4"))
    if producer in WNA16_METHODS:
        w = gptq_awq_weights(qc, producer)
        return Declaration(producer, "weight_only", f"{producer.upper()} int{w.bits}", None, acts, shape,
                           family="wna16", weights=w)
    if producer == "compressed-tensors":
        fmt = qc.get("format")
        quantized = [_ct_quantizes(g) for g in groups.values()]
        ints = {ct_int_weights(g) for g in groups.values()}
        if fmt == CT_WNA16_FORMAT and not groups:
            return Declaration(producer, "unquantized", None, fmt, acts, shape, family="wna16")
        if fmt == CT_WNA16_FORMAT and None not in ints and not any(quantized):
            return Declaration(producer, "weight_only", None, fmt, acts, shape, len(ints) > 1, family="wna16",
                               weights=next(iter(ints)))
        int_acts = _ct_int_acts(groups) if groups else None
        if int_acts is not None and fmt == int_acts[2]:
            return Declaration(producer, int_acts[0], None, fmt, acts, shape, family=int_acts[1], weights=int_acts[3])
        scheme = None if fmt != CT_NVFP4_FORMAT else (
            "unquantized" if not groups else "w4a4" if any(quantized) else "weight_only")
        return Declaration(producer, scheme, None, fmt if isinstance(fmt, str) else None, acts, shape,
                           any(quantized) and not all(quantized))
    if producer == MXFP4_METHOD:  # vLLM's Mxfp4Config reads nothing else of the config
        return Declaration(producer, "mxfp4", None, None, acts, shape, family="mxfp4")
    # no method at all: vLLM finds no quantization config and builds every layer unquantized
    return Declaration(producer, "unquantized" if producer == "none" else None, None, None, acts, shape)


def quantization_config(model_config: Any) -> Mapping[str, Any] | None:
    """The quantization config vLLM read for a model (its ModelConfig), in get_quant_config's order: the HF
    config's quantization_config (where vLLM also puts a legacy hf_quant_config.json), its text_config's, then a
    compressed-tensors compression_config."""
    hf = getattr(model_config, "hf_config", None)
    if hf is None:
        raise AdapterMismatch(f"{type(model_config).__name__} has no hf_config: update quantmatrix/adapter/declared.py")
    qc = getattr(hf, "quantization_config", None)
    text = getattr(hf, "text_config", None)
    if qc is None and text is not None:
        qc = getattr(text, "quantization_config", None)
    if qc is None:
        qc = getattr(hf, "compression_config", None)
    if qc is not None and not isinstance(qc, Mapping):
        raise AdapterMismatch(f"vLLM keeps the model's quantization config as a {type(qc).__name__}, not a dict: "
                              "update quantmatrix/adapter/declared.py")
    return qc


def of_model(model_config: Any) -> Declaration:
    """What the model vLLM is loading declares (the guard asks, beside what the layers' methods were built as)."""
    return declare(quantization_config(model_config))
