"""Quant-path dispatch: which scheme vLLM routes each checkpoint to."""

from quantmatrix.checks import dispatch


def test_config_dispatch(case, config_dir, resolution, judge):
    """The checkpoint's own config files, through vLLM's real resolution, pick the scheme the matrix expects
    (on a runner too small to serve a hub checkpoint, from the config files it holds of it)."""
    judge(dispatch.config_verdict, case, config_dir, resolution)
