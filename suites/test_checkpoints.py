"""Synthetic checkpoints: their files agree with their configs, load in transformers, and quantize sanely.
Each result is computed once per checkpoint (the arch x mode cases reuse it)."""

from quantmatrix.checks import checkpoint


def test_checkpoint_lint(case, lint_report, judge):
    """The tensors in the checkpoint's files agree with the scheme its config declares, per module and per
    expert; a malformed variant shows exactly the finding codes its `expect.lint` names."""
    judge(checkpoint.lint_verdict, case, lint_report)


def test_hf_reference(case, hf_greedy, judge):
    """The bf16 model loads in HF transformers from its own files (no missing or unexpected tensors) and
    greedily continues the shipped prompts exactly as the same weights' in-memory model (never saved) does."""
    judge(checkpoint.hf_verdict, case, hf_greedy)


def test_dequant_logits(case, dequant_error, judge):
    """The bf16 model that the NVFP4 export's files encode, decoded by vLLM's own dequantization (not the
    factory's unpack), gives logits within checks.checkpoint.LOGIT_REL_ERROR_BOUND of the bf16 model it was
    quantized from: the quantizer is sane."""
    judge(checkpoint.dequant_verdict, case, dequant_error)
