"""The GPU under test is what the cell says, and the mode really reaches it."""

from quantmatrix.checks import hardware


def test_device_identity(case, device_seen, judge):
    """A child process with the mode's environment sees exactly the cell's arch, and its allocator setting."""
    judge(hardware.device_verdict, case, device_seen)
