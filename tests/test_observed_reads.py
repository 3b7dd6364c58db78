"""observed_reads with the GPU simulated: no GPU here, so the layer is a fake MoE expert block on CPU whose
"kernel" reads a chosen set of tensor roles (a Marlin-like W4A16 kernel, or a W4A4 one that folds input_scale into
its alpha while converting, as vLLM's does). The measurement (measure.observed.observe) and the verdict
(checks.observed_reads) are the real ones, against the real `moe_backends` of matrices/default.yaml."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from matrixkit import case_for

from quantmatrix import properties as P
from quantmatrix.checks.observed_reads import observed_reads_verdict
from quantmatrix.measure.observed import Observation, observe, poison
from quantmatrix.schema.load import load

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = load(ROOT / "matrices" / "default.yaml")
HIDDEN, FFN = 16, 32


class FakeExperts(torch.nn.Module):
    """Parameters named as vLLM's NVFP4 experts; `reads` is what its simulated kernel uses."""

    def __init__(self, reads: frozenset[str], seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.reads = reads
        self.w13_weight = torch.nn.Parameter(torch.randint(0, 255, (FFN, HIDDEN // 2), generator=g,
                                                           dtype=torch.uint8), requires_grad=False)
        self.w13_weight_scale = torch.nn.Parameter(torch.rand(FFN, 1, generator=g) + 0.5, requires_grad=False)
        self.w13_weight_scale_2 = torch.nn.Parameter(torch.tensor(0.75), requires_grad=False)
        self.w13_input_scale = torch.nn.Parameter(torch.tensor(2.0), requires_grad=False)
        self.alpha = torch.tensor(1.0)

    def convert(self) -> None:
        """Kernel-format conversion: a W4A4 kernel folds input_scale into its alpha here, as the seed bug did."""
        self.alpha = self.w13_input_scale.detach().clone() if "input_scale" in self.reads else torch.tensor(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self.w13_weight if "weight" in self.reads else torch.full_like(self.w13_weight, 0x11)
        low, high = (packed & 0xF).float() - 8, (packed >> 4).float() - 8
        w = torch.stack([low, high], dim=-1).reshape(FFN, HIDDEN)
        if "block_scale" in self.reads:
            w = w * self.w13_weight_scale
        if "global_scale" in self.reads:
            w = w * self.w13_weight_scale_2
        return (x * self.alpha) @ w.T


ROLES = {"weight": "w13_weight", "block_scale": "w13_weight_scale", "global_scale": "w13_weight_scale_2",
         "input_scale": "w13_input_scale"}


def _observe(reads: set[str], forward_noise: bool = False) -> Observation:
    x = torch.randn(4, HIDDEN, generator=torch.Generator().manual_seed(1))

    def fresh() -> FakeExperts:
        return FakeExperts(frozenset(reads))

    def by_role(layer: FakeExperts) -> dict[str, list[tuple[str, torch.Tensor]]]:
        return {role: [(name, getattr(layer, name).data)] for role, name in ROLES.items()}

    def forward(layer: FakeExperts) -> torch.Tensor:
        layer.convert()
        with torch.no_grad():
            out = layer(x)
        return out + torch.rand(()) if forward_noise else out

    return observe(fresh, by_role, forward)


def _verdict(observation: Observation, backend: str, checkpoint: str = "qwen3moe-tiny-nvfp4-w4a4"):
    case = case_for(DEFAULT, checkpoint, "observed_reads", "sm100", "default")
    return observed_reads_verdict(case, replace(observation, backend=backend), DEFAULT.moe_backends)


@pytest.mark.parametrize("backend", ["MARLIN", "VLLM_CUTLASS", "FLASHINFER_TRTLLM"])
def test_simulated_gpu_kernel_reading_what_its_backend_declares_passes(backend):
    declared = set(DEFAULT.moe_backends[backend].reads)
    v = _verdict(_observe(declared), backend)
    assert v.problem is None, v.problem
    assert dict(v.properties)[P.OBSERVED_READS] == ",".join(sorted(declared))


def test_simulated_gpu_w4a4_kernel_whose_reads_omit_input_scale_fails_naming_the_tensor():
    """The seed bug's blind spot: a backend declared as not reading input_scale whose kernel folds it into its
    alpha. MARLIN declares no input_scale; a kernel that reads it is named, with the tensor poisoned."""
    v = _verdict(_observe({"weight", "block_scale", "global_scale", "input_scale"}), "MARLIN")
    assert v.problem is not None
    assert "the kernel reads input_scale (w13_input_scale: poisoning it changed the output) but " \
           "moe_backends.MARLIN.reads does not list it" in v.problem
    assert v.message.startswith("qwen3moe-tiny-nvfp4-w4a4@sm100-default observed_reads: backend MARLIN on sm100")


def test_simulated_gpu_kernel_not_reading_a_declared_role_fails():
    v = _verdict(_observe({"weight", "block_scale"}), "MARLIN")
    assert v.problem is not None and "lists global_scale, but poisoning w13_weight_scale_2 left the output " \
                                     "unchanged: the kernel does not read it" in v.problem


def test_a_role_the_layer_does_not_hold_is_not_required():
    """A weight-only layer has no input_scale tensor: a backend declaring it is judged on what the layer holds."""
    full = _observe({"weight", "block_scale", "global_scale"})
    held = Observation(changed={r: c for r, c in full.changed.items() if r != "input_scale"},
                       tensors={r: t for r, t in full.tensors.items() if r != "input_scale"})
    v = _verdict(held, "VLLM_CUTLASS", "qwen3moe-tiny-nvfp4-weight-only")
    assert v.problem is None, v.problem
    assert dict(v.properties)[P.ROLES_HELD] == "block_scale,global_scale,weight"


def test_nothing_measurable_fails_with_the_reason():
    noisy = _observe({"weight"}, forward_noise=True)
    assert noisy.error == "two clean runs of the layer differ, so a change cannot be blamed on a role"
    assert "nothing could be observed: two clean runs" in _verdict(noisy, "MARLIN").problem
    assert "is not described under moe_backends" in _verdict(_observe({"weight"}), "NO_SUCH").problem


def test_poison_makes_float_nan_and_flips_packed_bits():
    f, q = torch.ones(3), torch.tensor([0, 0x0F, 0xFF], dtype=torch.uint8)
    poison(f)
    poison(q)
    assert torch.isnan(f).all() and q.tolist() == [0xFF, 0xF0, 0x00]
