"""Reference data of the e2e tier: files keyed by checkpoint, scheme and mode, written only by
`--update-references` from a trusted run, and required otherwise (a missing reference fails, never passes).

    <references>/<checkpoint>/<scheme>/<mode>/outputs.json   greedy continuations with top-k logprobs
    <references>/<checkpoint>/<scheme>/<mode>/accuracy.json  task accuracy (correct, n) of a real checkpoint
    <references>/<checkpoint>/<scheme>/<mode>/outputs.gpu_tiny.json   the same, for the GPU-sized twin the
                                                                      engine runs on CUDA hosts
    <references>/<checkpoint>/<scheme>/<mode>/<family>/...   an `engine` reference, per arch family (sm12x:
                                                             sm120 and sm121; sm10x; sm9x), whose kernels differ

A trusted run is named by the checkpoint's `reference` expectation: `transformers` (HF transformers, greedy,
on the checkpoint's bf16 weights or its dequantized/ export: independent of vLLM and of the hardware, so one
file serves every arch) or `engine` (the current engine run, on a runner someone vouches for: one file per arch
family, so that two families' runners never overwrite each other's). Every file written is `"reviewed": false`
until a person accepts it (sets it true in the pull request that commits it, docs/runners.md); a case compared
with an unreviewed reference records it (UNREVIEWED_REFERENCE), and the report names it.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from quantmatrix import bounded
from quantmatrix.atomic import dump_json, write_atomic
from quantmatrix.checkpoints.store import DEQUANTIZED
from quantmatrix.errors import QuantmatrixError
from quantmatrix.schema.model import Cell


class ReferenceMissing(QuantmatrixError):
    """No reference (or a stale one) for a cell; the message says how to write it."""


def family(cell: Cell) -> str:
    """The arch family an engine reference is kept per: the compute capability's major version (sm120 and
    sm121 share sm12x's kernels, sm100 is sm10x, H100/H200 sm9x)."""
    return f"sm{cell.arch.capability[0]}x"


def path(root: Path, cell: Cell, kind: str, size: str | None = None) -> Path:
    """`size`: the synthetic size the engine ran when it is not the checkpoint's own (other weights)."""
    ck = cell.checkpoint
    where = root / ck.id / ck.scheme.name / cell.mode.name
    if ck.expectation("reference", default=None) == "engine":
        where = where / family(cell)
    return where / f"{kind}{'.' + size if size else ''}.json"


def reviewed(data: dict[str, Any]) -> bool:
    """A reference a person accepted (the files committed before the field existed were reviewed in their PRs)."""
    return data.get("reviewed", True) is True


def load(root: Path, cell: Cell, kind: str, size: str | None = None) -> dict[str, Any]:
    p = path(root, cell, kind, size)
    how = (f"write it from a trusted run: pytest suites -k '{cell.id}' --update-references "
           f"(source: {cell.checkpoint.expectation('reference')})")
    if not p.is_file():
        raise ReferenceMissing(f"{cell.id}: no {kind} reference for checkpoint {cell.checkpoint.id}, scheme "
                               f"{cell.checkpoint.scheme.name}, mode {cell.mode.name} ({p}); {how}")
    try:
        data = json.loads(bounded.read_text(p, "reference"))
    except (bounded.InputError, ValueError, RecursionError) as e:
        raise ReferenceMissing(f"{p}: unreadable reference ({str(e)[:200]}); {how}") from None
    if not isinstance(data, dict):
        raise ReferenceMissing(f"{p}: the reference is {type(data).__name__}, not an object; {how}")
    key = (data.get("checkpoint"), data.get("scheme"), data.get("mode"))
    if key != (cell.checkpoint.id, cell.checkpoint.scheme.name, cell.mode.name):
        raise ReferenceMissing(f"{p} is keyed {key}, not {cell.id}'s checkpoint/scheme/mode; {how}")
    return data


def write(root: Path, cell: Cell, kind: str, body: dict[str, Any], produced_by: dict[str, Any],
          size: str | None = None) -> Path:
    """Atomically: a concurrent reader sees the old file or the new one."""
    p = path(root, cell, kind, size)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = {"checkpoint": cell.checkpoint.id, "scheme": cell.checkpoint.scheme.name, "mode": cell.mode.name,
            "reviewed": False, "produced_by": {**produced_by, "date": datetime.date.today().isoformat()}, **body}
    write_atomic(p, dump_json(data))
    return p


def reference_weights(checkpoint_dir: Path) -> Path:
    """The bf16 model a checkpoint encodes: its dequantized/ export for NVFP4, itself for bf16."""
    deq = checkpoint_dir / DEQUANTIZED
    return deq if (deq / "config.json").is_file() else checkpoint_dir
