"""The sanitize mode's machinery on a pure-PyTorch reproduction, for a GPU host with torch and compute-sanitizer and
no vLLM (DEVELOPERS.md: the lent H200). Needs a GPU; it has not run on one yet.

`python bench/initcheck_repro.py [--out DIR] [--compute-sanitizer PATH] [--mode sanitize]` runs itself (`--child
DIR`) under the runner's compute-sanitizer with the default matrix's sanitize mode (its flags, its allocator
setting, one log per process: engine.runner.wrapped), then reads the run directory as the check does
(measure.sanitized, checks.sanitize) and prints the findings. The child builds two MoE layers the way vLLM's
RoutedExperts holds them (torch.empty on cuda, experts on dim 0), records them with engine.params (as built),
writes every tensor but experts 2-3 of layer 1's w13_input_scale, folds the alphas (the seed bug's read), replaces
input_scale by its per-layer max as a W4A4 conversion does (the old tensor is freed), records again with the marker,
then runs a "forward" that reads a fresh, never-written activation buffer (scratch noise) and one allocated after
the frees (it may reuse the freed input_scale's addresses: the marker must keep it off that tensor).

Expected, and checked (exit 0 when so, 1 when not, 2 when the run itself failed): exactly one finding, layer 1's
w13_input_scale as built, experts 2-3, read by the fold's kernels; the forward's reads counted as scratch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

E, H, I = 8, 256, 128  # noqa: E741 - the experts, hidden and intermediate sizes of the H200 probe
EXPECTED = ("model.layers.1.mlp.experts.routed_experts.w13_input_scale", [2, 3])


def child(directory: Path) -> None:
    import torch

    from quantmatrix.engine import params
    from quantmatrix.engine.protocol import BUILT, PROCESSED

    class RoutedExperts(torch.nn.Module):
        """What vLLM 0.32's MoE layer holds (adapter.engine.MOE_LAYER_CLASSES names the class)."""

        def __init__(self) -> None:
            super().__init__()
            self.local_num_experts = E
            empty = {"w13_weight": (E, 2 * I, H // 2), "w13_weight_scale_2": (E, 2), "w13_input_scale": (E, 2),
                     "w2_weight_scale_2": (E,), "w2_input_scale": (E,)}
            for name, shape in empty.items():
                dtype = torch.uint8 if name.endswith("weight") else torch.float32
                setattr(self, name, torch.nn.Parameter(torch.empty(shape, dtype=dtype, device="cuda"),
                                                       requires_grad=False))

    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList()
    for _ in range(2):
        layer = torch.nn.Module()
        layer.mlp = torch.nn.Module()
        layer.mlp.experts = torch.nn.Module()
        layer.mlp.experts.routed_experts = RoutedExperts()
        model.model.layers.append(layer)
    params.STATE.records.append({"stage": BUILT, "model": 0, "tensors": params.tensors(model), "marker": None})
    experts = [layer.mlp.experts.routed_experts for layer in model.model.layers]
    with torch.no_grad():
        for i, ex in enumerate(experts):  # the load: everything but experts 2-3 of layer 1's w13_input_scale
            ex.w13_weight.random_(0, 256)
            for name in ("w13_weight_scale_2", "w2_weight_scale_2", "w2_input_scale"):
                getattr(ex, name).fill_(0.01 if "weight" in name else 1.0)
            if i == 0:
                ex.w13_input_scale.fill_(1.0)
            else:
                ex.w13_input_scale[:2].fill_(1.0)
                ex.w13_input_scale[4:].fill_(1.0)
        for ex in experts:  # process_weights_after_loading: fold, then keep one scale per layer (frees the old)
            ex.g1_alphas = torch.nn.Parameter(ex.w13_weight_scale_2[:, 0] * ex.w13_input_scale.max(dim=1).values,
                                              requires_grad=False)
            ex.w13_input_scale = torch.nn.Parameter(ex.w13_input_scale.max().reshape(1), requires_grad=False)
        torch.cuda.synchronize()
        params.STATE.records.append({"stage": PROCESSED, "model": 0, "tensors": params.tensors(model),
                                     "marker": params.place_marker(model)})
        scratch = torch.empty(E, 2, device="cuda")  # after the frees: may take the old input_scale's addresses
        for ex in experts:  # the forward: reads its own never-written activation buffer
            activation = torch.empty(E, H, device="cuda")
            (activation.sum(dim=1) * ex.g1_alphas).sum()
        scratch.max()
        torch.cuda.synchronize()
    result = {"status": "ok", "workers": [{"pid": os.getpid(), "params": {**params.STATE.as_dict(),
                                                                          "requested": True}}]}
    (directory / "result.json").write_text(json.dumps(result))


def main(argv: list[str]) -> int:
    from quantmatrix.engine import runner
    from quantmatrix.host import sanitizer
    from quantmatrix.schema.load import load

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help="run directory (default: a new temporary one)")
    p.add_argument("--compute-sanitizer", type=Path, help="default: PATH, $CUDA_HOME/bin, /usr/local/cuda/bin")
    p.add_argument("--mode", default="sanitize", help="the default matrix's sanitized mode to take the knob from")
    args = p.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    exe = sanitizer.find(args.compute_sanitizer)
    if exe is None:
        print(f"no compute-sanitizer: {sanitizer.missing(args.compute_sanitizer)}", file=sys.stderr)
        return 2
    mode = load(ROOT / "matrices" / "default.yaml").mode(args.mode)
    directory = args.out or Path(tempfile.mkdtemp(prefix="initcheck-repro-"))
    directory.mkdir(parents=True, exist_ok=True)
    argv_ = runner.wrapped(runner.sanitizer_request(mode.sanitizer, exe), directory,
                           [sys.executable, __file__, "--child", str(directory)])
    print("running:", " ".join(argv_), flush=True)
    proc = subprocess.run(argv_, env={**os.environ, **mode.env}, cwd=ROOT)
    if proc.returncode != 0 or not (directory / "result.json").is_file():
        print(f"the reproduction failed (exit {proc.returncode}); logs in {directory}", file=sys.stderr)
        return 2
    return judge(directory, mode.sanitizer)


def judge(directory: Path, knob: object) -> int:
    from quantmatrix.checks import sanitize
    from quantmatrix.measure import sanitized

    measured = sanitized.run_directory(directory)
    judged = sanitize.judge(measured, knob)  # type: ignore[arg-type]
    print(f"{directory}: {measured.reports} reports, order {'split at the marker' if measured.ordered else 'unknown'}")
    print(f"logs: {measured.attribution}")  # which pid compute-sanitizer's %p gave: the process's or its own
    print("\n".join(measured.unreadable) or "every log read whole")
    for f in judged.failing:
        print(f"- {sanitize.describe(f)}")
    print(f"other uninitialised reads: {sanitize.other_line(measured.other)}")
    got = [(f.tensor.name, f.experts) for f in judged.failing]
    ok = not measured.unreadable and got == [EXPECTED] and measured.ordered and sum(measured.other.values()) > 0
    print("as expected" if ok else f"NOT as expected: findings {got}, expected [{EXPECTED}]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
