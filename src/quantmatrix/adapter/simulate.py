"""The capability simulation: make vLLM's platform report a CUDA device of a given compute capability, so the
layer-level checks run vLLM's own backend choice for every arch on a CPU-only host.

An optional kernel package that cannot initialise without a GPU (the CUDA build's flashinfer queries the device at
import, inside vLLM's backend oracle) is hidden from vLLM the way vLLM checks for it, and the layer is built again:
the backend choice is then vLLM's own for "without that package", and the case records `simulated_without`.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from quantmatrix.adapter.versions import Span, pick
from quantmatrix.errors import AdapterMismatch

# Optional kernel packages vLLM's backend oracles probe: import name -> the vLLM module whose cached `has_*`
# answers must be forgotten when the package is hidden or shown again.
_OPTIONAL = (Span({"flashinfer": "vllm.utils.flashinfer"}),)
_ABSENT = object()
# package -> why it could not initialise here; found once per process, then hidden from every simulated build
_unusable: dict[str, str] = {}

_INHERITED = object()
# The platform queries vLLM's backend oracles gate on (has/is_device_capability derive from the first).
# is_cpu answers False: a simulated CUDA device is not the CPU, and vLLM's oracles that put the CPU kernels first
# (int_wna16's CPU / ZEN_CPU, which need AMX) would otherwise never reach the CUDA backends' own device checks.
_PATCHED = ("get_device_capability", "is_cuda", "is_cuda_alike", "is_cpu")


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
            or current_platform.has_device_capability(number + 1) or current_platform.is_cpu()):
        raise AdapterMismatch(f"simulated capability {capability} did not take: vLLM's platform reports {got}; "
                              "update quantmatrix/adapter/simulate.py")


def no_platform_here() -> str | None:
    """Why vLLM has no platform of its own on this host, or None. The CUDA build without a GPU detects none
    (UnspecifiedPlatform): its backend oracles know no kernel for it (the unquantized one fails on an unset
    variable), so layers are only built for a simulated arch there."""
    from vllm.platforms import current_platform

    if not current_platform.is_unspecified():
        return None
    return (f"vLLM detects no platform on this host ({type(current_platform).__name__}: the CUDA build without a "
            "GPU), so it has no kernels of its own here")


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
    platform_cls.is_cpu = lambda self: False
    try:
        check_simulation(capability)
        yield
    finally:
        for name, value in saved.items():
            if value is _INHERITED:
                delattr(platform_cls, name)
            else:
                setattr(platform_cls, name, value)


def optional_packages() -> dict[str, str]:
    return pick("the optional kernel packages vLLM's backend oracles probe", _OPTIONAL, "simulate.py")


def implicated(error: BaseException) -> str | None:
    """The optional kernel package whose own code raised `error` (or the error it was handling): it could not
    initialise here. None when no optional package's code is on the traceback."""
    names = optional_packages()
    seen: BaseException | None = error
    while seen is not None:
        tb = seen.__traceback__
        while tb is not None:
            top = str(tb.tb_frame.f_globals.get("__name__", "")).split(".")[0]
            if top in names:
                return top
            tb = tb.tb_next
        seen = seen.__cause__ or seen.__context__
    return None


def note_unusable(package: str, error: BaseException) -> None:
    _unusable[package] = f"{type(error).__name__}: {error}".splitlines()[0][:300]


def unusable() -> tuple[str, ...]:
    """The optional packages found unable to initialise here, hidden from every simulated build from then on."""
    return tuple(sorted(_unusable))


def _forget_answers(packages: Iterable[str]) -> None:
    """Clear the functools caches of vLLM's `has_<package>*` helpers, so they ask again."""
    names = optional_packages()
    for package in packages:
        try:
            module = importlib.import_module(names[package])
        except ImportError as e:
            raise AdapterMismatch(f"{names[package]} is gone ({e}): update quantmatrix/adapter/simulate.py") from e
        for value in vars(module).values():
            clear = getattr(value, "cache_clear", None)
            if callable(clear):
                clear()


@contextlib.contextmanager
def without(packages: Iterable[str]) -> Iterator[None]:
    """Inside the block `packages` look uninstalled to vLLM (find_spec answers None, an import fails); restored on
    exit, with vLLM's cached answers forgotten both ways."""
    hidden = tuple(packages)
    if not hidden:
        yield
        return
    saved = {p: sys.modules.get(p, _ABSENT) for p in hidden}
    for package in hidden:
        sys.modules[package] = None  # type: ignore[assignment]  # the import system's own "not importable"
    _forget_answers(hidden)
    try:
        yield
    finally:
        for package, module in saved.items():
            if module is _ABSENT:
                sys.modules.pop(package, None)
            else:
                sys.modules[package] = module
        _forget_answers(hidden)
