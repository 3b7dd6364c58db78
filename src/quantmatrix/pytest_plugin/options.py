"""Every flag the plugin adds, each with its one validation, and the run id the CLI hands a run: one table, read
once into the frozen Settings (pytest_plugin.settings). `quantmatrix detect` takes --vllm-health-timeout from
here too, so this module imports no pytest (the CLI never loads it); a bad value is an OptionError naming its
flag, which pytest shows as a usage error and the CLI as exit 2."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantmatrix.errors import OptionError
from quantmatrix.schema.load import DEFAULT_MATRIX
from quantmatrix.schema.yamldoc import TRUST_FLAG

RUN_ID_ENV = "QUANTMATRIX_RUN_ID"  # set by `quantmatrix run`, stamped into the JUnit file


def _text(flag: str, value: str) -> str:
    return value


def _arch(flag: str, value: str) -> str:
    if not value.strip():
        raise OptionError(f"{flag} needs a name from the matrix, e.g. {flag} sm120 or {flag} gb10")
    return value.strip()


def _seconds(flag: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise OptionError(f"{flag} needs a positive number of seconds, not {value!r}")
    return seconds


def _gpus(flag: str, value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise OptionError(f"{flag} needs a whole number of GPUs >= 1, not {value!r}")
    return int(value)


def _executable(flag: str, value: str) -> Path:
    path = Path(value).expanduser()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise OptionError(f"{flag} needs the path of an executable file (compute-sanitizer), not {value!r}")
    return path.resolve()


@dataclasses.dataclass(frozen=True)
class Flag:
    """One command-line flag: `parse` None makes it a switch (store_true)."""

    name: str
    help: str
    parse: Callable[[str, str], Any] | None = None
    default: Any = None
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    def value(self, given: str | None) -> Any:
        """The flag's value from its text (validated), or its default when it was not given."""
        return self.default if given is None or self.parse is None else self.parse(self.name, given)


MATRIX_HELP = f"matrix YAML file (default: {DEFAULT_MATRIX} under the rootdir)"
MATRIX = Flag("--matrix", MATRIX_HELP, _text, metavar="FILE")
TRUST_MATRIX = Flag(TRUST_FLAG, "accept a matrix that sets trust_remote_code (the checkpoint's own Python runs in "
                                "the engine) or names files outside its repository: a matrix is data otherwise")
ARCH = Flag("--arch", "treat this host as arch NAME (name or alias) instead of detecting its GPUs", _arch,
            metavar="NAME")
STRICT_HARDWARE = Flag("--strict-hardware", "fail, instead of skip, gpu-tier cases whose arch this host lacks, "
                                            "and cpu cells whose `needs` it lacks (for a runner that is supposed to "
                                            "have that GPU or CPU)")
STRICT_CHECKPOINTS = Flag("--strict-checkpoints", "fail, instead of skip, cases whose hub checkpoint is not in the "
                                                  "local HF cache (for a runner that is supposed to hold them: see "
                                                  "`quantmatrix fetch`)")
_HEALTH_S = 120.0
HEALTH_TIMEOUT = Flag("--vllm-health-timeout", "time limit of the one-per-session check that the vLLM under test "
                                               f"imports (default {_HEALTH_S:g})", _seconds, _HEALTH_S, "S")
HEALTH_CHILD = Flag("--vllm-health-child", "check the vLLM under test in a child process even where this process runs "
                                           "the cases (a cold start then imports vLLM twice, but survives an import "
                                           "that crashes the interpreter)")
GPUS_PER_WORKER = Flag("--gpus-per-worker", "under pytest-xdist, pin each worker to its own N GPUs with "
                                            "CUDA_VISIBLE_DEVICES (worker gwK gets GPUs K*N .. K*N+N-1 of those "
                                            "visible); run with -n <GPUs / N>", _gpus, metavar="N")
TIME_LIMIT = Flag("--time-limit", "after S seconds, skip every case not yet started as 'not run' (the JUnit file "
                                  "is still written; the report counts those cases as untested)", _seconds,
                  metavar="S")
UPDATE_REFERENCES = Flag("--update-references", "write the e2e references (outputs, accuracies) of the selected "
                                                "cases from this trusted run, then check against them; without it "
                                                "a missing reference fails its case")
COMPUTE_SANITIZER = Flag("--compute-sanitizer", "the compute-sanitizer a mode with a `sanitizer:` knob wraps the "
                                                "engine in (default: PATH, then $CUDA_HOME/bin, /usr/local/cuda/bin)",
                         _executable, metavar="PATH")

FLAGS = (MATRIX, TRUST_MATRIX, ARCH, STRICT_HARDWARE, STRICT_CHECKPOINTS, HEALTH_TIMEOUT, HEALTH_CHILD, GPUS_PER_WORKER,
         TIME_LIMIT, UPDATE_REFERENCES, COMPUTE_SANITIZER)
