"""What the plugin resolved once (frozen Settings, pytest-timeout style) and what a pytest process caches
(Session): both live in the config's stash, and hooks and fixtures read only these."""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quantmatrix import properties as P
from quantmatrix.adapter.versions import versions
from quantmatrix.errors import QuantmatrixError
from quantmatrix.host.detect import Host, detect
from quantmatrix.schema.load import load
from quantmatrix.schema.model import Case, Cell, Matrix

DEFAULT_MATRIX = Path("matrices") / "default.yaml"
MATRIX_HELP = "matrix YAML file (default: matrices/default.yaml under the rootdir)"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything resolved once at configure time; `matrix_source` says where the matrix came from, so an error
    about it names the option, the ini key or the default that chose it."""

    matrix: Matrix | None
    matrix_source: str
    host: Host | None
    strict_hardware: bool
    strict_checkpoints: bool
    today: datetime.date
    runner: str
    health_timeout: float = 120.0  # seconds the vLLM health child may take (pytest_plugin.health)

    def host_properties(self) -> list[tuple[str, str]]:
        """Per-case copies of the host facts: per-case properties survive xdist, testsuite ones do not."""
        props = list(versions().items())
        devices = self.host.devices if self.host else ()
        props += [(P.RUNNER, self.runner),
                  (P.DEVICE_NAME, ", ".join(d.name for d in devices)),
                  (P.DEVICE_CAPABILITY, ", ".join(f"{d.capability[0]}.{d.capability[1]}" for d in devices))]
        return props


@dataclasses.dataclass
class Session:
    """One pytest process's caches: a result per key (a cell's arch and mode multiply the cases, not the work),
    and how many MoE layers were built (the closing figure: builds vs cases)."""

    memo: dict[tuple[str, Any], Any] = dataclasses.field(default_factory=dict)
    layer_builds: int = 0
    # axis marks per marker combination: building thousands of identical ones dominates collection
    marks: dict[tuple[str, ...], tuple[Any, ...]] = dataclasses.field(default_factory=dict)

    def once(self, key: tuple[str, Any], compute: Callable[[], Any]) -> Any:
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]


SETTINGS = pytest.StashKey[Settings]()
SESSION = pytest.StashKey[Session]()


def _matrix_path(config: pytest.Config) -> tuple[Path | None, str]:
    """(path, how it was chosen): --matrix is relative to the working directory, the ini value to the rootdir."""
    option, ini = config.getoption("matrix"), config.getini("quantmatrix_matrix")
    if option or ini:
        source = f"--matrix {option}" if option else f"ini option quantmatrix_matrix = {ini}"
        path = Path(option or ini)
        if not path.is_absolute():
            path = (Path.cwd() if option else config.rootpath) / path
        if not path.is_file():
            raise pytest.UsageError(f"{source}: no such file ({path})")
        return path, source
    default = config.rootpath / DEFAULT_MATRIX
    return (default, f"the default matrix {DEFAULT_MATRIX}") if default.is_file() else (None, "no matrix")


def resolve(config: pytest.Config) -> Settings:
    path, source = _matrix_path(config)
    matrix = host = None
    if path is not None:
        try:
            matrix = load(path)
            host = detect(matrix, config.getoption("arch"))
        except QuantmatrixError as e:
            raise pytest.UsageError(f"{e} (matrix from {source})") from None
    elif config.getoption("arch"):
        raise pytest.UsageError(f"--arch needs a matrix: pass --matrix FILE or create {DEFAULT_MATRIX}")
    return Settings(matrix, source, host, config.getoption("strict_hardware"),
                    config.getoption("strict_checkpoints"), datetime.date.today(),
                    os.environ.get("RUNNER_NAME") or socket.gethostname(), config.getoption("vllm_health_timeout"))


def case_of(item: pytest.Item) -> Case | None:
    """The item's matrix case (not the placeholder pytest puts in an empty parametrization)."""
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("case") if callspec is not None else None
    return case if isinstance(case, Case) else None


def xdist_group(cell: Cell) -> str:
    """The cell as an xdist_group name: `--dist loadgroup` takes the text after the last '@' of a node id, so the
    name must hold none (a cell id does: checkpoint@arch-mode)."""
    return cell.id.replace("@", "/")
