"""What the sanitize mode costs on the CPU side, measured here (docs/e2e.md#sanitize-mode): the parameter record
inside the engine (a walk of a Qwen3-30B-A3B-sized module tree, twice per load) and its size in the run's result,
and reading plus mapping initcheck reports as large as a healthy model's noise (the H200 measurements: 10,752
reports for 2 prompts x 16 tokens with the caching allocator, over 67,000 without it), written to a file and
streamed back as the check reads them.

`python bench/bench_sanitize.py` prints one line per figure. The GPU side (the instrumented load and forward) needs a
GPU: bench/initcheck_repro.py on the lent one.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from quantmatrix.engine import params  # noqa: E402
from quantmatrix.measure import initcheck, uninit  # noqa: E402

LAYERS, EXPERTS = 48, 128  # Qwen3-30B-A3B
ATTN = ("qkv_proj.weight", "qkv_proj.weight_scale", "o_proj.weight", "o_proj.weight_scale", "q_norm.weight",
        "k_norm.weight")
EXPERT = ("w13_weight", "w13_weight_scale", "w13_weight_scale_2", "w13_input_scale", "w2_weight", "w2_weight_scale",
          "w2_weight_scale_2", "w2_input_scale", "g1_alphas", "g2_alphas")


class RoutedExperts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.local_num_experts = EXPERTS
        for name in EXPERT:
            self.register_parameter(name, torch.nn.Parameter(torch.empty(EXPERTS, 1), requires_grad=False))


def model() -> torch.nn.Module:
    """The module tree and parameter count of a 48-layer, 128-expert MoE, each tensor one element per expert."""
    root = torch.nn.Module()
    root.layers = torch.nn.ModuleList()
    for _ in range(LAYERS):
        layer = torch.nn.Module()
        layer.self_attn = torch.nn.Module()
        for name in ATTN:
            mod, _, leaf = name.partition(".")
            if not hasattr(layer.self_attn, mod):
                setattr(layer.self_attn, mod, torch.nn.Module())
            getattr(layer.self_attn, mod).register_parameter(leaf, torch.nn.Parameter(torch.empty(1)))
        layer.mlp = torch.nn.Module()
        layer.mlp.experts = RoutedExperts()
        layer.input_layernorm = torch.nn.LayerNorm(1)
        root.layers.append(layer)
    return root


def _log(path: Path, reports: int) -> None:
    """`reports` copies of the real H200 probe's first report (34 lines each, backtrace included)."""
    lines = (ROOT / "tests" / "data" / "initcheck" / "initcheck-map-caching-h200.txt").read_text().splitlines()
    block = "\n".join(lines[2:36]) + "\n"
    with path.open("w") as f:
        f.write(lines[0] + "\n")
        for _ in range(reports):
            f.write(block)
        f.write(f"========= ERROR SUMMARY: {reports} errors\n")


def main() -> None:
    m = model()
    start = time.perf_counter()
    record = params.tensors(m)
    walk = time.perf_counter() - start
    size = len(json.dumps(record))
    print(f"record: {len(record)} tensors of a {LAYERS}-layer MoE in {walk * 1000:.0f} ms, {size / 1e3:.0f} kB of JSON "
          "per record (two per load)")
    printed = json.loads(next(x for x in (ROOT / "tests" / "data" / "initcheck" / "initcheck-map-caching-h200.txt")
                              .read_text().splitlines() if x.startswith("PARAMS "))[7:])
    rec = uninit.Record(tuple(uninit.from_params_line(printed, "PARAMS")), None)
    with tempfile.TemporaryDirectory() as tmp:
        for reports in (10_752, 67_000):
            path = Path(tmp) / "sanitizer.1.log"
            _log(path, reports)
            start = time.perf_counter()
            log = initcheck.read(path)
            read = time.perf_counter() - start
            start = time.perf_counter()
            mapped = uninit.map_reports(log, rec)
            mapping = time.perf_counter() - start
            print(f"report: {reports} reports, {path.stat().st_size / 1e6:.0f} MB, {reports * 34} lines: read "
                  f"{read:.2f} s, mapped {mapping:.2f} s ({sum(h.reads for h in mapped.hits)} reads in tensors)")


if __name__ == "__main__":
    main()
