"""A child process's view of the GPU under a mode's environment.

Run as a child so the mode's allocator variables (read once, when CUDA initialises) really apply, and so the
pytest process never holds a CUDA context of its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Mapping

from quantmatrix.matrix import Cell

_PROBE_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class Seen:
    name: str
    capability: tuple[int, int]
    device_count: int
    reserved_after_free: int


def run(env: Mapping[str, str], timeout: float = 120) -> Seen:
    proc = subprocess.run([sys.executable, "-m", "quantmatrix.probe"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"GPU probe failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return Seen(data["name"], tuple(data["capability"]), data["device_count"], data["reserved_after_free"])


def verdict(cell: Cell, seen: Seen) -> str | None:
    arch = cell.arch
    if seen.capability != arch.capability:
        return (f"cuda:0 is {seen.name} (capability {seen.capability[0]}.{seen.capability[1]}), but the cell "
                f"is {arch.describe()} (capability {arch.capability[0]}.{arch.capability[1]})")
    no_cache = cell.mode.env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
    if no_cache and seen.reserved_after_free != 0:
        return (f"mode {cell.mode.name} sets PYTORCH_NO_CUDA_MEMORY_CACHING=1, yet the allocator still "
                f"reserved {seen.reserved_after_free} bytes after the tensor was freed: the mode did not take "
                "effect, so this cell would not reproduce allocator-dependent bugs")
    if not no_cache and seen.reserved_after_free == 0:
        return (f"mode {cell.mode.name} expects the caching allocator, but nothing stayed reserved after a "
                "free: something disabled caching behind the matrix's back")
    return None


def main() -> None:
    import torch

    torch.cuda.init()
    x = torch.empty(_PROBE_BYTES, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    del x
    torch.cuda.synchronize()
    print(json.dumps({
        "name": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "device_count": torch.cuda.device_count(),
        "reserved_after_free": torch.cuda.memory_reserved(0),
    }))


if __name__ == "__main__":
    main()
