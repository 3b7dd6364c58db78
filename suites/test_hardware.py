"""The GPU under test is what the cell says, and the mode really reaches it."""

from quantmatrix import probe


def test_device_identity(cell, record_property):
    """A child process with the mode's environment sees exactly the cell's arch, and its allocator setting."""
    seen = probe.run(cell.mode.env)
    record_property("device_name", seen.name)
    record_property("device_capability", f"{seen.capability[0]}.{seen.capability[1]}")
    record_property("reserved_after_free", seen.reserved_after_free)
    problem = probe.verdict(cell, seen)
    assert problem is None, problem
