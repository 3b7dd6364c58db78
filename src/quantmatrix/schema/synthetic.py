"""What a synthetic checkpoint is, as the matrix states it: the spec and the words of its flags.

Every ambiguous shape the dispatch checks must cover (input_activations null / missing / empty, config_groups
empty or missing, the legacy hf_quant_config.json form) is a flag here, so a new shape is a matrix edit. The
factory (checkpoints.store) turns a spec into files through the scheme and producer modules schema.factory names.
"""

from __future__ import annotations

import dataclasses

from quantmatrix.schema.factory import FORMS as _FORMS
from quantmatrix.schema.factory import PRODUCERS, SCHEMES, FactoryScheme

MODELS = ("qwen3_moe", "mixtral", "gpt_oss")
# cpu_tiny runs on CPU paths only; gpu_tiny has hidden/intermediate multiples of 128, as Marlin and the
# CUTLASS/TRT-LLM NVFP4 MoE kernels require; block_tiny has 2x2 grids of 128x128 blocks per expert weight (block-wise
# FP8: a grid with more than one block, split whole across 2 ranks).
SIZES = ("cpu_tiny", "gpu_tiny", "block_tiny")
FORMS = tuple(_FORMS)
INPUT_ACTIVATIONS = ("quantized", "null", "missing", "empty")
CONFIG_GROUPS = ("present", "empty", "missing")
QUANTIZE = ("experts", "experts_attention")
# Which input-scale tensors the export holds, whatever its config says: `auto` = what the scheme implies.
INPUT_SCALES = ("auto", "present", "absent")
# Faults `corrupt_tensors` can put into a tensor (zero / inf / nan values, a wrong shape, or a scale stored as
# float8_e4m3fn: the wrong dtype, values rounded to E4M3).
FAULTS = ("zero", "inf", "nan", "shape", "dtype")
# The int32 slot orders a WNA16 producer may pack zero points in: AWQ's interleave, or GPTQ's sequential one.
ZERO_POINT_ORDERS = ("awq", "gptq")


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
    """What to generate. `producer` is the matrix checkpoint's, `scheme` the factory scheme its matrix scheme names
    (`factory:`, a key of schema.factory.SCHEMES); the rest comes from `synthetic:`."""

    producer: str
    scheme: str
    model: str = "qwen3_moe"
    size: str = "cpu_tiny"
    form: str = "config_json"
    input_activations: str | None = None  # None: what the scheme implies
    config_groups: str = "present"
    quant_algo: str | None = None  # None: what the scheme implies
    zero_point_order: str | None = None  # AWQ: the int32 slot order of its qzeros (None: AWQ's own)
    quantize: str = "experts"
    seed: int = 0  # the bf16 weights; every variant of a family shares them
    input_scales: str = "auto"
    omit_tensors: tuple[str, ...] = ()  # fnmatch globs over tensor names, each must match
    corrupt_tensors: tuple[tuple[str, str], ...] = ()  # (glob, fault) pairs

    @property
    def factory(self) -> FactoryScheme:
        return SCHEMES[self.scheme]

    @property
    def activations(self) -> str:
        return self.input_activations if self.input_activations is not None else self.factory.activations

    @property
    def with_input_scales(self) -> bool:
        """Whether the export holds input-scale tensors (`auto`: exactly when the scheme quantizes activations
        with static scales: its kind, not its config)."""
        return {"auto": self.factory.input_scales, "present": True, "absent": False}[self.input_scales]

    def problem(self) -> str | None:
        """Why no producer would write this combination, or None."""
        if self.scheme not in SCHEMES:
            return f"factory scheme {self.scheme!r} is none of {', '.join(SCHEMES)}"
        if self.model not in self.factory.models:
            return (f"model {self.model!r} has no {self.scheme} layout (the factory writes it for "
                    f"{', '.join(self.factory.models)})")
        producer, module = PRODUCERS[self.producer], self.factory.module
        if module not in producer.writes:
            makers = [p for p, d in PRODUCERS.items() if module in d.writes]
            return (f"producer {self.producer!r} writes no {module} checkpoints (it writes "
                    f"{', '.join(producer.writes)}); a {self.scheme} one comes from {', '.join(makers)}")
        if self.form not in producer.forms:
            owners = [p for p, d in PRODUCERS.items() if self.form in d.forms]
            return f"form {self.form!r} ({_FORMS[self.form]}) exists only for producer {', '.join(owners)}"
        for key in sorted({k for d in PRODUCERS.values() for k in d.keys} - set(producer.keys)):
            if getattr(self, key) is not None:
                owners = [p for p, d in PRODUCERS.items() if key in d.keys]
                return f"{key} is a key of producer {', '.join(owners)} only; producer is {self.producer!r}"
        if not self.factory.quantized and (self.omit_tensors or self.input_scales != "auto"):
            return (f"omit_tensors and input_scales act on quantized tensors; a {self.scheme} checkpoint has none "
                    "(corrupt_tensors works on its bf16 weights)")
        return None
