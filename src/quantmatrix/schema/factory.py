"""The synthetic factory's plug-ins as a matrix names them: factory schemes (what a matrix scheme's `factory:` says)
and producers, each with the module that implements it and what the matrix loader checks against it.

A new scheme or producer is one line here plus its module: checkpoints/schemes/<module>.py (how bf16 weights become
the format's tensors) or checkpoints/producers/<module>.py (how a producer names, packs and declares them). The
schema cannot import those modules (they are further down the data path), so the words live here and the factory
resolves the modules by name.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class FactoryScheme:
    """One factory scheme: the scheme module that encodes it and what its checkpoints declare by default."""

    module: str  # quantmatrix.checkpoints.schemes.<module>
    quantized: bool = True  # False: the family's bf16 weights as they are (no scales to omit or add)
    activations: str = "null"  # every config group's input_activations unless the spec says otherwise
    input_scales: bool = False  # whether `input_scales: auto` writes input-scale tensors
    granularity: str = "tensor"  # one weight scale per: tensor | channel | block (FP8; NVFP4's are fixed)
    params: tuple[tuple[str, object], ...] = ()  # the scheme module's variant (schemes.wna16.Params: bits, ...)
    # the model families it has a layout for: one Linear per expert (qwen3_moe, mixtral), or gpt-oss's fused experts
    models: tuple[str, ...] = ("qwen3_moe", "mixtral")


@dataclasses.dataclass(frozen=True)
class FactoryProducer:
    """One producer: its module, the scheme modules it has names and a recipe for, its config forms and the
    synthetic keys only it reads."""

    module: str  # quantmatrix.checkpoints.producers.<module>
    writes: tuple[str, ...]
    forms: tuple[str, ...] = ("config_json",)
    keys: tuple[str, ...] = ()
    # distributions the module builds with that quantmatrix does not depend on (vLLM brings them; imported as the
    # name with `_` for `-`): where one is missing, each case of such a synthetic checkpoint fails with one clear
    # cause (pytest_plugin.gates)
    packages: tuple[str, ...] = ()


# NVFP4 (W4A4) experts in every layer, FP8 attention in layer 0, only layer 1's o_proj FP8 (its q/k/v, the router
# and lm_head stay bf16): the shape of nvidia's NVFP4 MoE exports, with attention differing per layer
_MIXED: tuple[tuple[str, object], ...] = (
    ("plan", (("model.layers.*.mlp.experts.*", "NVFP4"), ("model.layers.0.self_attn.*", "FP8"),
              ("model.layers.1.self_attn.o_proj", "FP8"))),
)
SCHEMES = {
    "bf16": FactoryScheme("bf16", quantized=False, models=("qwen3_moe", "mixtral", "gpt_oss")),
    "nvfp4_weight_only": FactoryScheme("nvfp4"),
    "nvfp4_w4a4": FactoryScheme("nvfp4", activations="quantized", input_scales=True),
    "fp8_static": FactoryScheme("fp8", activations="quantized", input_scales=True),
    "fp8_dynamic": FactoryScheme("fp8", activations="quantized", granularity="channel"),
    "fp8_block": FactoryScheme("fp8_block", activations="quantized", granularity="block"),
    # integer weight-only (schemes.wna16): cpu_tiny's 64 inputs take groups of 32, gpu_tiny's 128 too
    "wna16_int4_g32": FactoryScheme("wna16", params=(("bits", 4), ("group_size", 32))),
    "wna16_int4_g32_actorder": FactoryScheme("wna16", params=(("bits", 4), ("group_size", 32), ("actorder", True))),
    "wna16_int4_g64": FactoryScheme("wna16", params=(("bits", 4), ("group_size", 64))),
    "wna16_int4_channel": FactoryScheme("wna16", params=(("bits", 4), ("group_size", -1))),
    "wna16_int8_g32": FactoryScheme("wna16", params=(("bits", 8), ("group_size", 32))),
    "wna16_int8_channel": FactoryScheme("wna16", params=(("bits", 8), ("group_size", -1))),
    # a group size neither tiny size's inputs divide (48): a malformed export
    "wna16_int4_g48": FactoryScheme("wna16", params=(("bits", 4), ("group_size", 48))),
    # ModelOpt MIXED_PRECISION (schemes.mixed): each projection's algo by the first `plan` glob it matches (HF
    # module names), the rest bf16; `unmapped`: quantized projections the per-layer map leaves out; `unlisted`:
    # bf16 projections the ignore list leaves out
    "mixed_nvfp4_fp8": FactoryScheme("mixed", activations="quantized", input_scales=True, params=_MIXED),
    "mixed_nvfp4_fp8_unmapped": FactoryScheme("mixed", activations="quantized", input_scales=True,
                                              params=(*_MIXED, ("unmapped", ("model.layers.1.self_attn.o_proj",)))),
    "mixed_nvfp4_fp8_unlisted": FactoryScheme("mixed", activations="quantized", input_scales=True,
                                              params=(*_MIXED, ("unlisted", ("model.layers.1.self_attn.*",)))),
    # int8 weights per channel, int8 activations dynamic per token (schemes.int8)
    "w8a8_int8": FactoryScheme("int8", activations="quantized"),
    # int4 weights in groups, FP8 activations dynamic per token (schemes.w4a8): vLLM 0.32 serves group 128 only
    "w4a8_fp8_g128": FactoryScheme("w4a8", activations="quantized", params=(("bits", 4), ("group_size", 128))),
    "w4a8_fp8_g64": FactoryScheme("w4a8", activations="quantized", params=(("bits", 4), ("group_size", 64))),
    # MXFP4 (schemes.mxfp4): E2M1 weights in blocks of 32 with an E8M0 scale each, gpt-oss's fused experts only;
    # bf16 activations in the checkpoint (the backend may quantize them to MXFP8 itself)
    "mxfp4": FactoryScheme("mxfp4", models=("gpt_oss",)),
    # MXFP8 (schemes.mxfp8): E4M3 weights with an E8M0 scale per 32 inputs (ModelOpt quant_algo MXFP8); bf16
    # activations in the checkpoint, no input_scale (vLLM's MXFP8 MoE quantizes them itself where it wants to)
    "mxfp8": FactoryScheme("mxfp8"),
}
PRODUCERS = {
    "modelopt": FactoryProducer("modelopt", writes=("nvfp4", "fp8", "mixed", "mxfp8"), forms=("config_json", "legacy"),
                                keys=("quant_algo",)),
    "compressed-tensors": FactoryProducer("compressed_tensors",
                                          writes=("nvfp4", "fp8", "fp8_block", "wna16", "int8", "w4a8"),
                                          packages=("compressed-tensors",)),
    # transformers' FineGrainedFP8 / DeepSeek format: quant_method fp8 (vLLM's Fp8Config)
    "fp8": FactoryProducer("hf_fp8", writes=("fp8", "fp8_block")),
    "gptq": FactoryProducer("gptq", writes=("wna16",)),
    "awq": FactoryProducer("awq", writes=("wna16",), keys=("zero_point_order",)),
    # OpenAI's gpt-oss export: quant_method mxfp4, *_blocks / *_scales per fused expert weight
    "mxfp4": FactoryProducer("mxfp4", writes=("mxfp4",)),
    "none": FactoryProducer("none", writes=("bf16",)),
}
# Where a producer's quantization config lives (`synthetic: {form: ...}`).
FORMS = {"config_json": "config.json quantization_config", "legacy": "hf_quant_config.json"}
# The (producer, factory scheme) of a family's bf16 member, which every quantized variant is made from.
UNQUANTIZED = ("none", "bf16")
