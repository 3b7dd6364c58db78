"""This host's GPUs, mapped to matrix archs by exact compute capability.

Detection is an ordered chain of small providers: the first that answers wins. It is the default answer of the
plugin's `pytest_quantmatrix_host` hook (pytest_plugin.hooks, pytest-xdist's `pytest_xdist_auto_num_workers`
style): a runner's conftest.py that answers that hook replaces it, without patching anything here.
Capability maps to exactly one family: sm120/sm121 are never "sm100 or later". No provider imports torch in this
process: torch.cuda is asked in a child (host.probe), and only when torch is a GPU build.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from quantmatrix.errors import MatrixError
from quantmatrix.host import probe
from quantmatrix.schema.model import Arch, Matrix

ARCH_ENV = "QUANTMATRIX_ARCH"
VISIBLE = "CUDA_VISIBLE_DEVICES"


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

    def count(self, arch: Arch) -> int:
        """GPUs of exactly this arch (a multi-GPU checkpoint needs that many)."""
        return sum(1 for d in self.devices if d.capability == arch.capability)

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


def cuda_visible(devices: list[Device]) -> tuple[list[Device], str]:
    """nvidia-smi lists the whole machine; CUDA in this process sees the GPUs CUDA_VISIBLE_DEVICES names, in
    its order, numbered from 0 (how an xdist worker pinned to its own GPUs counts them). Entries that are not
    indices (GPU or MIG UUIDs) leave the list as it is. The note says why none is left."""
    given = os.environ.get(VISIBLE)
    ids = [i.strip() for i in (given or "").split(",") if i.strip()]
    if given is None or not all(i.isdigit() for i in ids):
        return devices, ""
    by_index = {d.index: d for d in devices}
    seen: list[Device] = []
    for i in ids:  # CUDA stops at the first entry that names no device
        if int(i) not in by_index:
            break
        seen.append(dataclasses.replace(by_index[int(i)], index=len(seen)))
    return seen, "" if seen else f"{VISIBLE}={given!r} hides the {len(devices)} nvidia-smi lists"


def _from_nvidia_smi(matrix: Matrix, override: str | None) -> Host | None:
    devices = query_nvidia_smi()
    if devices is None:
        return None
    seen, note = cuda_visible(devices)
    return Host(tuple(seen), "nvidia-smi", note)


def torch_build() -> str | None:
    """'cpu', 'cuda <version>' or 'rocm <version>' from torch/version.py, read without importing torch (an import
    costs seconds and hundreds of MB, and must not happen while pytest collects); None: torch is not installed."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_py = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        tree = ast.parse(version_py.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return "unknown"
    found: dict[str, object] = {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            found[target.id] = node.value.value
    for key, label in (("cuda", "cuda"), ("hip", "rocm")):
        if found.get(key):
            return f"{label} {found[key]}"
    return "cpu" if "cuda" in found else "unknown"


def query_torch() -> tuple[list[Device], str]:
    """torch.cuda's view, asked in a child process (host.probe) unless torch is absent or a CPU build; the note
    says why there is no device."""
    build = torch_build()
    if build is None:
        return [], "torch not installed"
    if build == "cpu":
        return [], "CPU build of torch"
    try:
        devices = [Device(i, name, cap) for i, name, cap in probe.devices()]
    except probe.ProbeError as e:
        return [], f"torch ({build}) could not list devices: {e}"
    return devices, "" if devices else f"torch ({build}) sees none"


def _from_torch(matrix: Matrix, override: str | None) -> Host | None:
    devices, note = query_torch()
    return Host(tuple(devices), "torch.cuda", note)


_CHAIN: tuple[Provider, ...] = (_from_override, _from_env, _from_nvidia_smi, _from_torch)


def detect(matrix: Matrix, override: str | None = None) -> Host:
    """--arch (`override`), then QUANTMATRIX_ARCH, then nvidia-smi, then torch.cuda."""
    for provider in _CHAIN:
        host = provider(matrix, override)
        if host is not None:
            return host
    raise AssertionError("the torch provider always answers")
