"""Detection maps capabilities to exactly one family, and the providers answer in order."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from matrixkit import write

from quantmatrix import properties as P
from quantmatrix.checks import hardware
from quantmatrix.host import detect, probe
from quantmatrix.pytest_plugin.settings import Settings
from quantmatrix.schema.load import load
from quantmatrix.schema.model import Case, Cell


@pytest.fixture
def matrix(tmp_path):
    return load(write(tmp_path))


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(detect, "query_nvidia_smi", lambda: None)
    monkeypatch.setattr(detect, "query_torch", lambda: ([], "faked"))
    monkeypatch.delenv(detect.ARCH_ENV, raising=False)


@pytest.mark.parametrize(("cap", "arch"), [((10, 0), "sm100"), ((12, 0), "sm120"), ((12, 1), "sm121"),
                                          ((10, 3), None), ((9, 0), None), ((12, 2), None)])
def test_capability_maps_to_exactly_one_family(matrix, cap, arch):
    """12.0 is sm120 only and 12.1 sm121 only; 10.3 (B300) is not 'sm100 or later': unknown caps map to none."""
    found = matrix.arch_for_capability(cap)
    assert (found.name if found else None) == arch


def test_nvidia_smi_rows_are_parsed_with_output_faked():
    """The driver's csv rows become devices with integer capabilities."""
    out = "0, NVIDIA GB10, 12.1\n1, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0\n"
    assert detect.parse_nvidia_smi(out) == [
        detect.Device(0, "NVIDIA GB10", (12, 1)),
        detect.Device(1, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", (12, 0))]


def test_override_beats_env_beats_driver_beats_torch_with_cuda_queries_faked(matrix, monkeypatch):
    """--arch wins over QUANTMATRIX_ARCH, which wins over nvidia-smi, which wins over torch.cuda."""
    monkeypatch.setattr(detect, "query_torch", lambda: ([detect.Device(0, "torch view", (9, 0))], ""))
    monkeypatch.setattr(detect, "query_nvidia_smi", lambda: [detect.Device(0, "NVIDIA GB10", (12, 1))])
    monkeypatch.setenv(detect.ARCH_ENV, "rtx_pro_6000")
    assert detect.detect(matrix, "b200").source == "--arch"
    assert detect.detect(matrix).archs(matrix)[0].name == "sm120"
    monkeypatch.delenv(detect.ARCH_ENV)
    host = detect.detect(matrix)
    assert (host.source, [a.name for a in host.archs(matrix)]) == ("nvidia-smi", ["sm121"])
    monkeypatch.setattr(detect, "query_nvidia_smi", lambda: None)
    assert detect.detect(matrix).source == "torch.cuda"


def test_unknown_gpu_is_described_not_mapped_with_cuda_queries_faked(matrix, monkeypatch, no_cuda):
    """A GPU outside the matrix is named with its family so the skip reason explains the miss."""
    monkeypatch.setattr(detect, "query_torch", lambda: ([detect.Device(0, "NVIDIA L4", (8, 9))], ""))
    host = detect.detect(matrix)
    assert host.archs(matrix) == []
    assert host.describe(matrix) == "cuda:0 NVIDIA L4 [sm89, not in the matrix]"


def test_no_cuda_is_described_with_its_cause(matrix, no_cuda):
    """No device at all says so, with the reason the provider gave."""
    assert detect.detect(matrix).describe(matrix) == "no CUDA device (faked)"


def test_env_override_with_typo_is_a_matrix_error(matrix, monkeypatch, no_cuda):
    """QUANTMATRIX_ARCH must name an arch of the matrix; a typo says which it was closest to."""
    monkeypatch.setenv(detect.ARCH_ENV, "sm12l")
    with pytest.raises(Exception, match=r"QUANTMATRIX_ARCH=sm12l: .*no arch 'sm12l'"):
        detect.detect(matrix)


def test_real_torch_query_is_consistent_on_this_host():
    """The real torch provider never raises: with a CUDA build and a GPU it lists devices and no note; a CPU
    build lists none and says so (this CPU CI host); a CUDA build without a GPU lists none and says why."""
    devices, note = detect.query_torch()
    build = detect.torch_build()
    if build == "cpu":
        assert (devices, note) == ([], "CPU build of torch")
    elif devices:
        assert note == "" and all(isinstance(d, detect.Device) for d in devices)
    else:
        assert note.startswith(f"torch ({build})"), note


def _cell(matrix, arch: str, mode: str) -> Cell:
    return next(c for c in matrix.cells() if c.arch.name == arch and c.mode.name == mode)


def _case(matrix, arch: str, mode: str) -> Case:
    """The small matrix's gpu-tier check on one cell, standing in for device_identity."""
    return Case(matrix.checks["gpu_probe"], _cell(matrix, arch, mode), None)


@pytest.mark.parametrize(("arch", "mode", "seen", "fragment"), [
    ("sm121", "nocache", probe.Seen("NVIDIA GB10", (12, 1), 1, 0), None),
    ("sm121", "default", probe.Seen("NVIDIA GB10", (12, 1), 1, 64 << 20), None),
    ("sm121", "default", probe.Seen("NVIDIA RTX PRO 6000", (12, 0), 1, 64 << 20),
     "cuda:0 is NVIDIA RTX PRO 6000 (capability 12.0), but the cell is sm121 (GB10 / DGX Spark)"),
    ("sm120", "nocache", probe.Seen("NVIDIA RTX PRO 6000", (12, 0), 1, 64 << 20),
     "sets PYTORCH_NO_CUDA_MEMORY_CACHING=1, yet the allocator still reserved 67108864 bytes"),
    ("sm120", "default", probe.Seen("NVIDIA RTX PRO 6000", (12, 0), 1, 0), "expects the caching allocator"),
])
def test_device_identity_verdict_with_probe_results_faked(matrix, arch, mode, seen, fragment):
    """The gpu-tier identity check judges (faked) probe output: exact arch, and the mode's allocator in effect."""
    problem = hardware.device_verdict(_case(matrix, arch, mode), seen).problem
    assert (problem is None) if fragment is None else (fragment in problem), problem


def test_device_identity_records_what_cuda0_is_under_names_the_plugin_does_not_stamp(matrix):
    """Each property once per case: the probe's device and capability have names of their own, apart from the
    host's device list (DEVICE_NAME, DEVICE_CAPABILITY) and every other name the plugin puts on each case."""
    seen = probe.Seen("NVIDIA GB10", (12, 1), 1, 0)
    v = hardware.device_verdict(_case(matrix, "sm121", "nocache"), seen)
    assert v.properties == ((P.PROBED_DEVICE, "NVIDIA GB10"), (P.PROBED_CAPABILITY, "12.1"),
                            (P.RESERVED_AFTER_FREE, 0))
    host = detect.Host((detect.Device(0, "NVIDIA GB10", (12, 1)),), "--arch")
    stamped = {name for name, _ in Settings.host_properties(SimpleNamespace(host=host, runner="runner-1"))}
    stamped |= P.CELL_PROPERTIES
    assert {P.DEVICE_NAME, P.DEVICE_CAPABILITY} <= stamped
    assert not stamped & {name for name, _ in v.properties}


@pytest.mark.parametrize(("visible", "seen", "note"), [
    (None, ["0 A", "1 B", "2 C", "3 D"], ""),
    ("2,3", ["0 C", "1 D"], ""),
    ("3,1", ["0 D", "1 B"], ""),
    ("1,7,2", ["0 B"], ""),  # CUDA stops at the first entry that names no device
    ("", [], "CUDA_VISIBLE_DEVICES='' hides the 4 nvidia-smi lists"),
    ("GPU-8c6a1f2e,1", ["0 A", "1 B", "2 C", "3 D"], ""),  # UUIDs: not read here, the list stays whole
])
def test_nvidia_smi_devices_are_those_cuda_visible_devices_shows_this_process_with_nvidia_smi_faked(
        matrix, monkeypatch, no_cuda, visible, seen, note):
    """nvidia-smi lists the machine; a process pinned with CUDA_VISIBLE_DEVICES (an xdist worker) counts only
    its own GPUs, numbered as CUDA numbers them."""
    machine = [detect.Device(i, name, (12, 1)) for i, name in enumerate("ABCD")]
    monkeypatch.setattr(detect, "query_nvidia_smi", lambda: machine)
    if visible is None:
        monkeypatch.delenv(detect.VISIBLE, raising=False)
    else:
        monkeypatch.setenv(detect.VISIBLE, visible)
    host = detect.detect(matrix)
    assert ([f"{d.index} {d.name}" for d in host.devices], host.note) == (seen, note)
    assert host.count(matrix.arch("sm121")) == len(seen)
