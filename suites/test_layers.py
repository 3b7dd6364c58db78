"""Layer-level dispatch and post-load audit: vLLM's own MoE layer for each checkpoint on each (simulated) arch."""

from quantmatrix.checks import audit, dispatch, kernel


def test_layer_dispatch(case, moe_layer, matrix, judge):
    """The MoE method, its weight/activation scheme and the kernel backend are what the matrix accepts."""
    judge(dispatch.layer_verdict, case, moe_layer, matrix.moe_backends)


def test_post_load_audit(case, moe_layer, load_audit, matrix, judge):
    """Every tensor the selected backend reads was loaded from the checkpoint and holds a usable value."""
    judge(audit.audit_verdict, case, moe_layer, matrix.moe_backends, load_audit)


def test_kernel_format(case, kernel_layer, kernel_format, matrix, judge):
    """vLLM's post-processing leaves finite dequant alphas, and keeps activation scales exactly where the
    backend reads them."""
    judge(kernel.kernel_verdict, case, kernel_layer, matrix.moe_backends, kernel_format)
