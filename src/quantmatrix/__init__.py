"""quantmatrix: a cross-hardware regression suite for quantized MoE checkpoints served by vLLM."""

__version__ = "0.1.0"
