"""What this host's CPU offers vLLM's CPU build beyond its plain vector kernels: the capabilities a cpu cell may state
it needs (`cpu_cells[].needs`, schema.vocab.HOST_NEEDS), so that a cell whose quantized MoE has no CPU kernel on
another host skips there saying what is missing, instead of failing with a finding that is not one.

Read from /proc/cpuinfo and the installed packages, never by importing torch or vLLM (the gates ask before any case
runs, in the pytest process). What each word means, with the vLLM 0.32 test it stands for:

- `zen_cpu`: vLLM's Zen CPU platform, on which its ZEN_CPU MoE backends (zentorch's experts) run. vLLM picks it on
  an AMD CPU with AVX-512 when the zentorch package imports (vllm/platforms/__init__.py `_is_amd_zen_cpu`,
  `cpu_platform_plugin`); here: `AuthenticAMD` and an avx512 flag in /proc/cpuinfo, and zentorch installed.
- `amx`: Intel AMX tiles (the `amx_tile` flag), which vLLM's own CPU INT4, INT8 and FP8 experts need
  (`torch.cpu._is_amx_tile_supported()` in fused_moe/experts/cpu_moe.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Callable, Iterable
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


@dataclasses.dataclass(frozen=True)
class Cpu:
    """The first processor's vendor and flags, and whether zentorch is installed (`source`: where they were read)."""

    vendor: str
    flags: frozenset[str]
    zentorch: bool
    source: str

    def lacks(self, need: str) -> str | None:
        """Why this host lacks `need` (a word of schema.vocab.HOST_NEEDS), or None when it has it."""
        return _LACKS[need](self)

    def describe(self) -> str:
        wide = sorted(f for f in self.flags if f in ("avx512f", "amx_tile"))  # the two the needs ask about
        return (f"{self.vendor or 'unknown vendor'}, {' '.join(wide) or 'neither avx512f nor amx_tile'}; zentorch "
                f"{'installed' if self.zentorch else 'not installed'} ({self.source})")


def _lacks_zen_cpu(cpu: Cpu) -> str | None:
    if cpu.vendor != "AuthenticAMD" or not any(f.startswith("avx512") for f in cpu.flags):
        return "vLLM's Zen CPU platform needs an AMD CPU with AVX-512"
    if not cpu.zentorch:
        return "vLLM's Zen CPU platform needs the zentorch package (setup.sh installs it on such a CPU)"
    return None


def _lacks_amx(cpu: Cpu) -> str | None:
    return None if "amx_tile" in cpu.flags else "vLLM's own CPU experts need AMX tiles (flag amx_tile)"


_LACKS: dict[str, Callable[[Cpu], str | None]] = {"zen_cpu": _lacks_zen_cpu, "amx": _lacks_amx}
WORDS = tuple(_LACKS)  # what this module can answer for; schema.vocab.HOST_NEEDS names the same (a test holds them)


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """(vendor_id, flags) of the first processor listed: every core of one host reports the same."""
    vendor, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return vendor, flags


@functools.cache
def this_host() -> Cpu:
    try:
        vendor, flags = parse_cpuinfo(CPUINFO.read_text(encoding="utf-8", errors="replace"))
        source = str(CPUINFO)
    except OSError as e:
        vendor, flags, source = "", frozenset(), f"{CPUINFO} unreadable: {e.strerror}"
    return Cpu(vendor, flags, importlib.util.find_spec("zentorch") is not None, source)


def missing(needs: Iterable[str], cpu: Cpu | None = None) -> list[str]:
    """`need: why` for each need the host lacks, in the order stated."""
    cpu = cpu or this_host()
    return [f"{n}: {why}" for n in needs if (why := cpu.lacks(n))]
