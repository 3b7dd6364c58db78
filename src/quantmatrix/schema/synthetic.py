"""What a synthetic checkpoint is, as the matrix states it: the spec and the words of its flags.

Every ambiguous shape the dispatch checks must cover (input_activations null / missing / empty, config_groups
empty or missing, the legacy hf_quant_config.json form) is a flag here, so a new shape is a matrix edit. The
factory (checkpoints.configs, checkpoints.export) turns a spec into files.
"""

from __future__ import annotations

import dataclasses

MODELS = ("qwen3_moe", "mixtral")
# cpu_tiny runs on CPU paths only; gpu_tiny has hidden/intermediate multiples of 128, as Marlin and the
# CUTLASS/TRT-LLM NVFP4 MoE kernels require.
SIZES = ("cpu_tiny", "gpu_tiny")
FORMS = ("config_json", "legacy")
INPUT_ACTIVATIONS = ("quantized", "null", "missing", "empty")
CONFIG_GROUPS = ("present", "empty", "missing")
QUANTIZE = ("experts", "experts_attention")
# Which input-scale tensors the export holds, whatever its config says: `auto` = what the scheme implies.
INPUT_SCALES = ("auto", "present", "absent")
# Faults `corrupt_tensors` can put into a tensor (zero / inf / nan values, or a wrong shape).
FAULTS = ("zero", "inf", "nan", "shape")


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
    """What to generate; producer and scheme come from the matrix checkpoint, the rest from `synthetic:`."""

    producer: str
    scheme: str
    model: str = "qwen3_moe"
    size: str = "cpu_tiny"
    form: str = "config_json"
    input_activations: str | None = None  # None: what the scheme implies
    config_groups: str = "present"
    quant_algo: str | None = None  # None: what the scheme implies
    quantize: str = "experts"
    seed: int = 0  # the bf16 weights; every variant of a family shares them
    input_scales: str = "auto"
    omit_tensors: tuple[str, ...] = ()  # fnmatch globs over tensor names, each must match
    corrupt_tensors: tuple[tuple[str, str], ...] = ()  # (glob, fault) pairs

    @property
    def activations(self) -> str:
        if self.input_activations is not None:
            return self.input_activations
        return "quantized" if self.scheme == "nvfp4_w4a4" else "null"

    def problem(self) -> str | None:
        """Why no producer would write this combination, or None."""
        if self.form == "legacy" and self.producer != "modelopt":
            return "form 'legacy' (hf_quant_config.json) exists only for producer modelopt"
        if self.quant_algo is not None and self.producer != "modelopt":
            return f"quant_algo is a ModelOpt key; producer is {self.producer!r}"
        if (self.scheme == "bf16") != (self.producer == "none"):
            return "scheme bf16 goes with producer none (and only it)"
        if self.producer == "none" and (self.omit_tensors or self.input_scales != "auto"):
            return ("omit_tensors and input_scales act on NVFP4 tensors; a bf16 checkpoint has none "
                    "(corrupt_tensors works on its bf16 weights)")
        return None
