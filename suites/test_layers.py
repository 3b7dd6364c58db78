"""Layer-level dispatch and post-load audit: vLLM's own MoE layer for each checkpoint on each (simulated) arch, at
every rank of the cell's parallel layout; on the GPU, what the selected kernel really reads."""

from quantmatrix.checks import ranks
from quantmatrix.checks.numerics import numerics_verdict
from quantmatrix.checks.observed_reads import observed_reads_verdict


def test_layer_dispatch(case, moe_layer, matrix, judge):
    """The MoE method, its weight/activation scheme and the kernel backend are what the matrix accepts, on every
    rank."""
    judge(ranks.layer_verdict, case, moe_layer, matrix.moe_backends)


def test_post_load_audit(case, moe_layer, load_audit, matrix, judge):
    """Every tensor the selected backend reads was loaded from the checkpoint and holds a usable value, on every
    rank."""
    judge(ranks.audit_verdict, case, moe_layer, matrix.moe_backends, load_audit)


def test_kernel_format(case, kernel_layer, kernel_format, matrix, judge):
    """vLLM's post-processing leaves finite dequant alphas, and keeps activation scales exactly where the
    backend reads them, on every rank."""
    judge(ranks.kernel_verdict, case, kernel_layer, matrix.moe_backends, kernel_format)


def test_rank_shards(case, ranked, judge):
    """Every rank holds exactly its part of every checkpoint tensor (the reference split, from the files alone),
    every expert is on the ranks the layout puts it on, and a layout that cannot split exactly is refused."""
    judge(ranks.shards_verdict, case, ranked)


def test_observed_reads(case, observed_reads, matrix, judge):
    """On the cell's GPU, the tensor roles whose poisoning (NaN) changes the layer's output are exactly the roles
    the matrix says the selected backend reads."""
    judge(observed_reads_verdict, case, observed_reads, matrix.moe_backends)


def test_layer_numerics(case, layer_numerics, judge):
    """vLLM's MoE experts, on every backend its oracle picks or its override can force on the cell's arch, stay
    within the matrix's cosine and relative-error bounds of the bf16 MoE the same files decode to."""
    judge(numerics_verdict, case, layer_numerics)
