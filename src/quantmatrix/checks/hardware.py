"""device_identity: the GPU under test is exactly the cell's arch, and the mode's allocator setting reaches it."""

from __future__ import annotations

from quantmatrix import properties as P
from quantmatrix.checks.verdict import Verdict
from quantmatrix.host.probe import Seen
from quantmatrix.schema.model import Case


def device_verdict(case: Case, seen: Seen) -> Verdict:
    """What cuda:0 of the case's own child is, under names of its own: the host's device list is already on
    every case (DEVICE_NAME), and a property is written once per case."""
    return Verdict.of(case, _problem(case, seen), [
        (P.PROBED_DEVICE, seen.name), (P.PROBED_CAPABILITY, f"{seen.capability[0]}.{seen.capability[1]}"),
        (P.RESERVED_AFTER_FREE, seen.reserved_after_free)])


def _problem(case: Case, seen: Seen) -> str | None:
    cell = case.cell
    return device_problem(cell.arch.describe(), cell.arch.capability, cell.mode.name,
                          cell.mode.env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1", seen)


def device_problem(arch: str, capability: tuple[int, int], mode: str, no_cache: bool, seen: Seen) -> str | None:
    """cuda:0 must be exactly `arch` (`capability`), and the allocator must cache exactly when `mode` does."""
    if tuple(seen.capability) != tuple(capability):
        return (f"cuda:0 is {seen.name} (capability {seen.capability[0]}.{seen.capability[1]}), but the cell "
                f"is {arch} (capability {capability[0]}.{capability[1]})")
    if no_cache and seen.reserved_after_free != 0:
        return (f"mode {mode} sets PYTORCH_NO_CUDA_MEMORY_CACHING=1, yet the allocator still "
                f"reserved {seen.reserved_after_free} bytes after the tensor was freed: the mode did not take "
                "effect, so this cell would not reproduce allocator-dependent bugs")
    if not no_cache and seen.reserved_after_free == 0:
        return (f"mode {mode} expects the caching allocator, but nothing stayed reserved after a "
                "free: something disabled caching behind the matrix's back")
    return None
