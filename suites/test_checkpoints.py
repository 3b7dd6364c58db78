"""Synthetic checkpoints: their files agree with their configs, load in transformers, and quantize sanely.
Each result is computed once per checkpoint (the arch x mode cases reuse it)."""

from quantmatrix.checkpoints import DEQUANTIZED, lint, verify


def test_checkpoint_lint(cell, checkpoint_dir, quantmatrix_settings, record_property):
    """The tensors in the checkpoint's files agree with the scheme its config declares, per module and per
    expert; a malformed variant shows exactly the finding codes its `expect.lint` names."""
    report = quantmatrix_settings.once(("lint", checkpoint_dir),
                                       lambda: lint.lint(checkpoint_dir, block_scales=True))
    record_property("lint_declared", f"{report.declared.producer} {report.declared.scheme}")
    record_property("lint_findings", len(report.findings))
    problem = verify.lint_verdict(cell.checkpoint.expectation("lint"), report)
    assert problem is None, problem


def test_hf_reference(cell, checkpoint_dir, quantmatrix_settings, record_property):
    """The bf16 model loads in HF transformers from its own files (no missing or unexpected tensors) and
    greedily continues the shipped prompts exactly as recorded when the factory built it."""
    got, problem = quantmatrix_settings.once(("hf_reference", checkpoint_dir),
                                             lambda: verify.hf_reference(checkpoint_dir))
    record_property("greedy_ids", got)
    assert problem is None, problem


def test_dequant_logits(cell, checkpoint_dir, quantmatrix_settings, record_property):
    """The bf16 model that the NVFP4 export's tensors encode (its dequantized/ copy) gives logits within
    verify.LOGIT_REL_ERROR_BOUND of the bf16 model it was quantized from: the quantizer is sane."""
    bf16 = verify.base_dir(cell.checkpoint)
    key = ("dequant_logits", verify.digest(checkpoint_dir / DEQUANTIZED / "model.safetensors"), bf16)
    err = quantmatrix_settings.once(key, lambda: verify.dequant_error(checkpoint_dir, bf16))
    record_property("logit_rel_error", round(err.rel_error, 5))
    record_property("top1_agreement", round(err.top1, 4))
    problem = err.verdict()
    assert problem is None, f"{cell.id}: {problem}"
