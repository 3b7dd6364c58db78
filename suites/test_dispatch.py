"""Quant-path dispatch: which scheme vLLM routes each checkpoint to."""

from quantmatrix.checks import dispatch


def test_config_dispatch(case, checkpoint_dir, resolution, judge):
    """The checkpoint's own config files, through vLLM's real resolution, pick the scheme the matrix expects."""
    judge(dispatch.config_verdict, case, checkpoint_dir, resolution)
