"""Layer-level dispatch and post-load audit: vLLM's own MoE layer for each checkpoint on each (simulated) arch."""

from quantmatrix import audit, dispatch


def test_layer_dispatch(cell, moe_layer, quantmatrix_settings, record_property):
    """The MoE method, its weight/activation scheme and the kernel backend are what the matrix accepts."""
    layer = moe_layer.layer
    record_property("moe_method", layer.method if layer else "")
    record_property("moe_backend", layer.backend if layer else "")
    record_property("moe_weight_only", str(layer.weight_only).lower() if layer else "")
    record_property("layer_build_error", moe_layer.error or "")
    problem = dispatch.layer_verdict(cell, moe_layer, quantmatrix_settings.matrix.moe_backends)
    assert problem is None, problem


def test_post_load_audit(cell, load_audit, record_property):
    """Every tensor the selected backend reads was loaded from the checkpoint and holds a usable value."""
    record_property("moe_backend", load_audit.backend)
    record_property("unloaded_unread", "; ".join(f.describe() for f in load_audit.notes if f.kind == "unloaded"))
    record_property("audit_notes", "; ".join(f.describe() for f in load_audit.notes if f.kind != "unloaded"))
    ck = cell.checkpoint
    words = f"{ck.id} ({ck.producer}, {ck.scheme.name}) on {cell.arch.describe()}"
    expected = ck.expectation("audit", cell.arch)
    problem = audit.verdict(load_audit, words, ck.scheme.name == "nvfp4_weight_only", expected)
    assert problem is None, problem


def test_kernel_format(cell, kernel_format, record_property):
    """vLLM's post-processing leaves finite dequant alphas, and drops activation scales for weight-only kernels."""
    record_property("activation_scales_kept", str(kernel_format.activation_scales_kept).lower())
    assert kernel_format.alphas_finite, "g1_alphas/g2_alphas hold non-finite values after kernel-format conversion"
    if cell.checkpoint.scheme.name == "nvfp4_weight_only":
        assert not kernel_format.activation_scales_kept, "weight-only kernel format still carries activation scales"
