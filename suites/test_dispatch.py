"""Quant-path dispatch: which scheme vLLM routes each checkpoint to."""

from quantmatrix import dispatch


def test_config_dispatch(cell, checkpoint_dir, resolution, record_property):
    """The checkpoint's own config files, through vLLM's real resolution, pick the scheme the matrix expects."""
    shape = dispatch.config_shape(checkpoint_dir)
    record_property("config_shape", shape)
    record_property("quant_method", resolution.quant_method)
    record_property("quant_config_class", resolution.config_class)
    record_property("resolved_algo", resolution.algo)
    record_property("resolved_scheme", resolution.scheme)
    problem = dispatch.verdict(cell.checkpoint, resolution, shape)
    assert problem is None, problem
