"""This host's GPUs, mapped to matrix archs by exact compute capability.

Detection is an ordered chain of small providers (pytest-xdist's auto-workers style): the first that
answers wins. Capability maps to exactly one family: sm120/sm121 are never "sm100 or later".
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator

from quantmatrix.errors import MatrixError
from quantmatrix.matrix import Arch, Matrix

ARCH_ENV = "QUANTMATRIX_ARCH"
_INHERITED = object()


@dataclasses.dataclass(frozen=True)
class Device:
    index: int
    name: str
    capability: tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Host:
    """What detection saw, and how (`source`), so a skip reason can say why a GPU was not found."""

    devices: tuple[Device, ...]
    source: str
    note: str = ""

    def archs(self, matrix: Matrix) -> list[Arch]:
        found = (matrix.arch_for_capability(d.capability) for d in self.devices)
        return list(dict.fromkeys(a for a in found if a is not None))

    def has(self, arch: Arch) -> bool:
        return any(d.capability == arch.capability for d in self.devices)

    def describe(self, matrix: Matrix) -> str:
        if not self.devices:
            return f"no CUDA device ({self.note})" if self.note else "no CUDA device"
        parts = []
        for d in self.devices:
            arch = matrix.arch_for_capability(d.capability)
            family = arch.describe() if arch else f"sm{d.capability[0]}{d.capability[1]}, not in the matrix"
            parts.append(f"cuda:{d.index} {d.name} [{family}]")
        return ", ".join(parts) + (f" (via {self.source})" if self.source != "torch.cuda" else "")


Provider = Callable[[Matrix, "str | None"], "Host | None"]


def _from_override(matrix: Matrix, override: str | None) -> Host | None:
    """--arch NAME: a runner states what it is (e.g. detection is unreliable in its container)."""
    if not override:
        return None
    arch = matrix.arch(override)
    return Host((Device(0, f"declared {arch.label}", arch.capability),), "--arch")


def _from_env(matrix: Matrix, override: str | None) -> Host | None:
    name = os.environ.get(ARCH_ENV)
    if not name:
        return None
    try:
        arch = matrix.arch(name)
    except MatrixError as e:
        raise MatrixError(f"{ARCH_ENV}={name}: {e}") from None
    return Host((Device(0, f"declared {arch.label}", arch.capability),), ARCH_ENV)


def query_nvidia_smi() -> list[Device] | None:
    """Ask the driver (no CUDA context in this process); None when nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=index,name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(out)


def parse_nvidia_smi(out: str) -> list[Device]:
    """Rows of `index, name, compute_cap` as `--format=csv,noheader` prints them."""
    devices = []
    for line in out.strip().splitlines():
        idx, name, cap = (p.strip() for p in line.split(","))
        major, _, minor = cap.partition(".")
        devices.append(Device(int(idx), name, (int(major), int(minor))))
    return devices


def _from_nvidia_smi(matrix: Matrix, override: str | None) -> Host | None:
    devices = query_nvidia_smi()
    if devices is None:
        return None
    return Host(tuple(devices), "nvidia-smi")


def query_torch() -> tuple[list[Device], str]:
    """torch.cuda's view; the note says why there is none (no torch, CPU build, no driver)."""
    try:
        import torch
    except ImportError:
        return [], "torch not installed"
    if not torch.cuda.is_available():
        build = "CPU build of torch" if torch.version.cuda is None else f"torch {torch.__version__} sees none"
        return [], build
    return [Device(i, torch.cuda.get_device_name(i), tuple(torch.cuda.get_device_capability(i)))
            for i in range(torch.cuda.device_count())], ""


def _from_torch(matrix: Matrix, override: str | None) -> Host | None:
    devices, note = query_torch()
    return Host(tuple(devices), "torch.cuda", note)


PROVIDERS: tuple[Provider, ...] = (_from_override, _from_env, _from_nvidia_smi, _from_torch)


def detect(matrix: Matrix, override: str | None = None) -> Host:
    for provider in PROVIDERS:
        host = provider(matrix, override)
        if host is not None:
            return host
    raise AssertionError("the torch provider always answers")


@contextlib.contextmanager
def simulate(arch: Arch) -> Iterator[None]:
    """Make vLLM's platform report a CUDA device of `arch`'s capability, for CPU-only layer checks.

    vLLM's has/is_device_capability helpers derive from get_device_capability, and backend oracles gate on
    is_cuda / is_cuda_alike. Import vLLM's quantization modules *before* entering (some evaluate
    capability-dependent constants at import). The platform is restored on exit, and a simulation that does not
    take (a vLLM upgrade moved the seams) raises AdapterMismatch instead of silently checking the CPU platform.
    """
    from quantmatrix import vllm_adapter

    platform_cls, device_capability = vllm_adapter.platform_seams()
    names = ("get_device_capability", "is_cuda", "is_cuda_alike")
    saved = {name: platform_cls.__dict__.get(name, _INHERITED) for name in names}
    cap = device_capability(*arch.capability)
    platform_cls.get_device_capability = classmethod(lambda cls, device_id=0: cap)
    platform_cls.is_cuda = lambda self: True
    platform_cls.is_cuda_alike = lambda self: True
    try:
        vllm_adapter.check_simulation(arch.capability)
        yield
    finally:
        for name, value in saved.items():
            if value is _INHERITED:
                delattr(platform_cls, name)
            else:
                setattr(platform_cls, name, value)
