"""The environment a failure happened in, as vLLM's own `vllm collect-env` gathers it (the module the CLI runs,
in a child process: a broken vLLM cannot take the caller with it, and the report is the one a vLLM maintainer
asks for in an issue)."""

from __future__ import annotations

import subprocess
import sys

# `vllm collect-env` runs this module's main(); `python -m` runs the same without vLLM's CLI around it.
COLLECT_ENV = "vllm.collect_env"


def collect_env(timeout_s: float = 300.0) -> tuple[str, str | None]:
    """(what collect-env printed, None) or (what it printed so far, why it did not finish)."""
    try:
        proc = subprocess.run([sys.executable, "-m", COLLECT_ENV], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return out, f"{COLLECT_ENV} gave no answer within {timeout_s:.0f} s"
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return proc.stdout, f"{COLLECT_ENV} exited {proc.returncode}: {tail}"
    return proc.stdout, None
