"""The hooks quantmatrix adds to pytest (registered by pytest_plugin.core's pytest_addhooks, as pytest-xdist
registers its newhooks): a runner's conftest.py implements them to change what the plugin would decide."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from quantmatrix.host.detect import Host
    from quantmatrix.schema.model import Matrix


@pytest.hookspec(firstresult=True)
def pytest_quantmatrix_host(config: pytest.Config, matrix: Matrix, arch: str | None) -> Host | None:
    """This host's GPUs, as a `quantmatrix.host.detect.Host`, asked once per pytest process after the matrix
    loaded (on an xdist worker, after it was pinned to its own GPUs). `arch` is the --arch value (None when not
    given). Return None to leave it to the next implementation; quantmatrix's own, called last, is the chain
    --arch, QUANTMATRIX_ARCH, nvidia-smi, torch.cuda (host.detect.detect)."""
