"""Layer-level dispatch and post-load audit: vLLM's own MoE layer for each checkpoint on each (simulated) arch;
on the GPU, what the selected kernel really reads."""

from quantmatrix.checks import audit, dispatch, kernel
from quantmatrix.checks.observed_reads import observed_reads_verdict


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


def test_observed_reads(case, observed_reads, matrix, judge):
    """On the cell's GPU, the tensor roles whose poisoning (NaN) changes the layer's output are exactly the roles
    the matrix says the selected backend reads."""
    judge(observed_reads_verdict, case, observed_reads, matrix.moe_backends)
