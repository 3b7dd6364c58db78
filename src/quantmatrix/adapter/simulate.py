"""The capability simulation: make vLLM's platform report a CUDA device of a given compute capability, so the
layer-level checks run vLLM's own backend choice for every arch on a CPU-only host."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from quantmatrix.errors import AdapterMismatch

_INHERITED = object()
# The platform queries vLLM's backend oracles gate on (has/is_device_capability derive from the first).
_PATCHED = ("get_device_capability", "is_cuda", "is_cuda_alike")


def platform_seams() -> tuple[type, Any]:
    """The platform class whose capability queries the simulation patches, and vLLM's DeviceCapability."""
    try:
        from vllm.platforms import current_platform
        from vllm.platforms.interface import DeviceCapability
    except ImportError as e:
        raise AdapterMismatch(f"vLLM platform seams moved ({e}); update quantmatrix/adapter/simulate.py") from e
    cls = type(current_platform)
    for name in (*_PATCHED, "has_device_capability"):
        if not hasattr(cls, name):
            raise AdapterMismatch(f"{cls.__name__} has no {name}: the capability simulation no longer fits")
    return cls, DeviceCapability


def check_simulation(capability: tuple[int, int]) -> None:
    """Prove the simulation took: vLLM's own helpers must now answer for the simulated arch."""
    from vllm.platforms import current_platform

    number = capability[0] * 10 + capability[1]
    got = current_platform.get_device_capability()
    if (got is None or tuple(got) != capability or not current_platform.is_cuda()
            or not current_platform.has_device_capability(number)
            or current_platform.has_device_capability(number + 1)):
        raise AdapterMismatch(f"simulated capability {capability} did not take: vLLM's platform reports {got}; "
                              "update quantmatrix/adapter/simulate.py")


@contextlib.contextmanager
def simulate(capability: tuple[int, int]) -> Iterator[None]:
    """vLLM's platform reports `capability` inside the block, and is restored on exit.

    Import vLLM's quantization modules *before* entering (some evaluate capability-dependent constants at
    import: adapter.layers.prepare does). A simulation that does not take (a vLLM upgrade moved the seams)
    raises AdapterMismatch instead of silently checking the CPU platform.
    """
    platform_cls, device_capability = platform_seams()
    saved = {name: platform_cls.__dict__.get(name, _INHERITED) for name in _PATCHED}
    cap = device_capability(*capability)
    platform_cls.get_device_capability = classmethod(lambda cls, device_id=0: cap)
    platform_cls.is_cuda = lambda self: True
    platform_cls.is_cuda_alike = lambda self: True
    try:
        check_simulation(capability)
        yield
    finally:
        for name, value in saved.items():
            if value is _INHERITED:
                delattr(platform_cls, name)
            else:
                setattr(platform_cls, name, value)
