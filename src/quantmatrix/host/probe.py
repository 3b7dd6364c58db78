"""`python -m quantmatrix.host.probe [--devices]`: a child process's view of the GPUs.

Run as a child so that a mode's allocator variables (read once, when CUDA initialises) really apply, and so
that the pytest process never imports torch or holds a CUDA context of its own. Without arguments it allocates
and frees a tensor under the caller's environment (the device_identity check); `--devices` lists the devices.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from quantmatrix.errors import QuantmatrixError

_PROBE_BYTES = 64 << 20


class ProbeError(QuantmatrixError):
    """The probe child failed or said nothing readable."""


@dataclasses.dataclass(frozen=True)
class Seen:
    name: str
    capability: tuple[int, int]
    device_count: int
    reserved_after_free: int


def _child(args: list[str], env: Mapping[str, str], timeout: float) -> Any:
    try:
        proc = subprocess.run([sys.executable, "-m", "quantmatrix.host.probe", *args], env={**os.environ, **env},
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ProbeError(f"GPU probe gave no answer within {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise ProbeError(f"GPU probe failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise ProbeError(f"GPU probe printed no JSON: {proc.stdout[-500:]!r}") from None


def run(env: Mapping[str, str], timeout: float = 120) -> Seen:
    data = _child([], env, timeout)
    return Seen(data["name"], tuple(data["capability"]), data["device_count"], data["reserved_after_free"])


def devices(timeout: float = 60) -> list[tuple[int, str, tuple[int, int]]]:
    """(index, name, capability) of every device torch.cuda sees, asked in a child."""
    return [(d["index"], d["name"], tuple(d["capability"])) for d in _child(["--devices"], {}, timeout)]


def _list_devices() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [{"index": i, "name": torch.cuda.get_device_name(i),
             "capability": list(torch.cuda.get_device_capability(i))} for i in range(torch.cuda.device_count())]


def _allocate() -> dict[str, Any]:
    import torch

    torch.cuda.init()
    x = torch.empty(_PROBE_BYTES, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    del x
    torch.cuda.synchronize()
    return {"name": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
            "device_count": torch.cuda.device_count(), "reserved_after_free": torch.cuda.memory_reserved(0)}


if __name__ == "__main__":
    print(json.dumps(_list_devices() if sys.argv[1:] == ["--devices"] else _allocate()))
