"""Factory cost: one tiny checkpoint family (bf16 + every NVFP4 variant the default matrix holds for that
model) built cold in a fresh process, its size on disk, and what a cached spec costs.

    PYTHONPATH=src python bench/bench_factory.py [--matrix matrices/default.yaml]

Prints plain figures; the cache goes to a temporary directory (QUANTMATRIX_CACHE is overridden).
Measured on the 2-core CPU runner (factory v2): imports 1.9-4.2 s once; Qwen3-MoE family of the default matrix
(bf16 + 15 NVFP4 variants) 3.9 s cold (6-7.5 s under load), 1.02 MiB per checkpoint of which dequantized/ is
0.55; a cached spec 50-90 us."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", type=Path, default=Path("matrices") / "default.yaml")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quantmatrix-bench-") as tmp:
        os.environ["QUANTMATRIX_CACHE"] = tmp
        t0 = time.perf_counter()
        import torch  # noqa: F401  (imports counted once, separately)
        import transformers  # noqa: F401

        from quantmatrix.checkpoints import store
        from quantmatrix.schema.load import load

        t_import = time.perf_counter() - t0
        matrix = load(args.matrix)
        print(f"imports (torch, transformers, quantmatrix): {t_import:.2f} s")
        for model in ("qwen3_moe", "mixtral"):
            family = [c for c in matrix.checkpoints
                      if c.source.kind == "synthetic" and c.source.value.get("model", "qwen3_moe") == model]
            t = time.perf_counter()
            dirs = [store.materialize(c) for c in family]
            cold = time.perf_counter() - t
            size = sum(_size(d) for d in dirs)
            t = time.perf_counter()
            for _ in range(10):
                for c in family:
                    store.materialize(c)
            cached = (time.perf_counter() - t) / (10 * len(family))
            print(f"{model}: {len(family)} checkpoints (bf16 + {len(family) - 1} NVFP4 variants) built in "
                  f"{cold:.2f} s ({cold / len(family) * 1000:.0f} ms each incl. the shared bf16 build), "
                  f"{size / 2**20:.1f} MiB on disk ({size / len(family) / 2**20:.2f} MiB each, dequantized/ "
                  f"included); cached spec: {cached * 1e6:.0f} us")


if __name__ == "__main__":
    main()
