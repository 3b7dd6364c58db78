"""The reference split: from a checkpoint's files alone (safetensors headers and data), what each rank of a parallel
layout must hold of every tensor of vLLM's MoE blocks, and where a rank's loaded tensors differ from it.

The rule is Megatron's, which vLLM's fused experts follow; vLLM's own sharding code is never called. Gate and up
are column parallel: each of n tensor-parallel ranks holds 1/n of their output rows, the gate's in the first half of
its fused `w13_` parameter and the up's in the second. Down is row parallel: each rank holds 1/n of its input
columns (`w2_`). A checkpoint tensor is laid out as a Linear's weight, output axis first and input axis last (a role
stored otherwise is listed in _IN_AXIS_ONLY); a tensor that does not vary along the split axis (extent 1, one value
per projection) is whole on every rank, in its shard's slot. Under expert parallelism vLLM does not slice experts
(its MoE tensor-parallel size is 1): each rank holds whole experts, the ones its own expert map names.

A split that cannot be exact (a tensor's extent along the split axis not a multiple of the ranks: a packed byte, a
quantization group or a block would straddle two ranks) makes the layout impossible: vLLM must refuse it, or pad
each rank to whole blocks, rank r starting at r x (its padded part), as vLLM's FP8 block oracle documents
(pad_tp_shard_to_weight_blocks). A rank holding anything else is named by rank, parameter, expert and slice.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

from quantmatrix.adapter.roles import FUSED_SHARDS, SHARDS
from quantmatrix.checkpoints.lint import read_headers
from quantmatrix.checkpoints.producers import role_of
from quantmatrix.measure.logical import Logical

_IN_AXIS_ONLY = frozenset({"g_idx"})  # roles indexed by input feature alone: whole on column-parallel ranks
# roles that describe the whole projection (compressed-tensors' weight_shape, [out, in]): whole on every rank, each
# shard writing the whole of its expert row (gate and up say the same)
_WHOLE_ROW = frozenset({"weight_shape"})


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a rank's part of a checkpoint tensor goes: `source` slices the tensor, `dest` the rank's expert row
    (both flat when `flat`: one value per projection in a two-slot row; `dest` slices the row's transpose when
    `transposed`: a row stored input axis first, as GPTQ-style kernels keep it)."""

    source: tuple[slice, ...]
    dest: tuple[slice, ...]
    flat: bool = False
    transposed: bool = False

    def held(self, row: torch.Tensor) -> torch.Tensor:
        """What the row holds where the part belongs."""
        if self.flat:
            return row.reshape(-1)[self.dest[0]]
        return (row.transpose(-1, -2) if self.transposed else row)[self.dest]

    def part(self, tensor: torch.Tensor) -> torch.Tensor:
        """The part of the checkpoint tensor."""
        return tensor.reshape(-1)[self.source[0]] if self.flat else tensor[self.source]


def split_axis(shard: str, shape: Sequence[int], role: str) -> int | None:
    """The axis a tensor of shard `shard` is split along over tensor-parallel ranks; None: whole on every rank."""
    if role in _WHOLE_ROW:
        return None
    if shard == "w2":  # row parallel: the input axis
        axis = len(shape) - 1 if len(shape) >= 2 or role in _IN_AXIS_ONLY else None
    else:  # column parallel: the output axis
        axis = None if role in _IN_AXIS_ONLY or not shape else 0
    return None if axis is None or shape[axis] == 1 else axis


def part(extent: int, rank: int, ranks: int, unit: int = 1) -> tuple[int, int, bool]:
    """(start, size, exact) of a rank's part of `extent` elements: 1/ranks of it, or where that is not a whole
    number of `unit`s (the tensor's elements per block along the axis), whole blocks padded: rank r from r x S."""
    if extent % ranks == 0 and (extent // ranks) % unit == 0:
        per = extent // ranks
        return rank * per, per, True
    slot = math.ceil(extent / unit / ranks) * unit
    start = min(rank * slot, extent)
    return start, min(slot, extent - start), False


def source_part(shard: str, source: Sequence[int], rank: int, ranks: int, role: str, unit: int = 1
                ) -> tuple[slice, ...]:
    """The slices of a checkpoint tensor that are `rank`'s part (all of it where it is whole on every rank)."""
    out = [slice(0, s) for s in source]
    axis = split_axis(shard, source, role)
    if axis is not None:
        start, size, _ = part(source[axis], rank, ranks, unit)
        out[axis] = slice(start, start + size)
    return tuple(out)


def place(shard: str, source: Sequence[int], row: Sequence[int], rank: int, ranks: int, role: str,
          unit: int = 1) -> Place | tuple[str, str]:
    """The reference place of a rank's part of one checkpoint tensor in its expert row, or (kind, why) where the
    row cannot hold it (`shape`) or no rule places these shapes (`unplaced`). A two-dimensional row that cannot
    hold the part as the checkpoint lays it out but can hold it transposed is taken as stored transposed."""
    if role in _WHOLE_ROW and math.prod(row) == math.prod(source):
        return Place((slice(0, math.prod(source)),), (slice(0, math.prod(row)),), flat=True)
    if math.prod(source) == 1:
        if math.prod(row) == 1:
            return Place((slice(0, 1),), (slice(0, 1),), flat=True)
        if math.prod(row) == 2 and shard in ("w1", "w3"):
            i = FUSED_SHARDS["w13"].index(shard)
            return Place((slice(0, 1),), (slice(i, i + 1),), flat=True)
        return "unplaced", f"one value into a row of shape {list(row)}"
    if len(row) != len(source):
        return "unplaced", f"a {list(source)} tensor into a row of shape {list(row)}"
    plain = _place(shard, source, row, rank, ranks, role, unit)
    if isinstance(plain, Place) or len(row) != 2:
        return plain
    flipped = _place(shard, source, tuple(reversed(row)), rank, ranks, role, unit)
    return Place(flipped.source, flipped.dest, transposed=True) if isinstance(flipped, Place) else plain


def _place(shard: str, source: Sequence[int], row: Sequence[int], rank: int, ranks: int, role: str,
           unit: int) -> Place | tuple[str, str]:
    axis = split_axis(shard, source, role)
    for d, (s, t) in enumerate(zip(source, row, strict=True)):
        if d != axis and t < s:
            return "shape", f"axis {d} holds {t}, the checkpoint has {s}"
    src = source_part(shard, source, rank, ranks, role, unit)
    dest = [slice(0, x.stop - x.start) for x in src]
    if axis is not None:
        size = src[axis].stop - src[axis].start
        w13 = shard in ("w1", "w3")
        width = row[axis] // 2 if w13 else row[axis]
        if width < size or (w13 and row[axis] % 2):
            return "shape", f"axis {axis} slot holds {width}, its part is {size} of {source[axis]}"
        offset = width * FUSED_SHARDS["w13"].index(shard) if w13 else 0
        dest[axis] = slice(offset, offset + size)
    return Place(src, tuple(dest))


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte-exact (NaN equals NaN): b is cast to a's dtype first, as vLLM's copy_ casts what it loads."""
    b = b.to(a.dtype)
    return a.shape == b.shape and bool(torch.equal(_bytes(a), _bytes(b)))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes in order. Torch calls a tensor contiguous whatever stride its size-1 dims keep (a one-value
    slice, a transposed [n, 1] column), and a byte view refuses a last stride other than 1: those are copied."""
    flat = t.reshape(-1)
    if flat.numel() and flat.stride(0) != 1:
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


def slices(s: Sequence[slice]) -> str:
    return "[" + ", ".join(f"{x.start}:{x.stop}" for x in s) + "]"


class Checkpoint:
    """A checkpoint's MoE tensors from its files: shapes from the headers (validated), data on demand; per
    (experts module, projection, leaf) the canonical shape, the one most experts share (a tensor of another shape is
    malformed: the lint names it, the split leaves it out). Packed integer tensors (WNA16) are taken in their
    logical form (Logical): codes, zero points and scales as [out, in or groups], which is what splits over ranks
    whichever way a producer packs or transposes them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.headers, _, _ = read_headers(path)
        self.logical = Logical.of(path)
        self._data: dict[str, torch.Tensor] = {}
        shapes: dict[tuple[str, str, str], list[tuple[int, ...]]] = collections.defaultdict(list)
        for name in self.headers:
            key = expert_key(name)
            if key is not None:
                shapes[key[0], key[2], key[3]].append(self.shape(name))
        self.canonical = {k: collections.Counter(v).most_common(1)[0][0] for k, v in shapes.items()}

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape in the form the split compares (logical for packed integer tensors)."""
        shape = tuple(self.headers[name].shape)
        return shape if self.logical is None else self.logical.shape(name, shape)

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self._data:
            from safetensors import safe_open

            with safe_open(str(self.headers[name].file), framework="pt") as f:
                raw = f.get_tensor(name)
            self._data[name] = raw if self.logical is None else self.logical.tensor(name, raw)
        return self._data[name]

    def malformed(self, name: str) -> bool:
        key = expert_key(name)
        return key is not None and self.shape(name) != self.canonical[key[0], key[2], key[3]]

    def unit(self, module: str, projection: str, leaf: str, shard: str) -> int:
        """Elements of this tensor per block along its split axis: its extent over the coarsest extent its
        projection's tensors split along (a packed weight over its block scale); 1 where it is the coarsest."""
        shape = self.canonical[module, projection, leaf]
        axis = split_axis(shard, shape, role_of(leaf))
        if axis is None:
            return 1
        extents = [s[split_axis(shard, s, role_of(lf)) or 0] for (m, p, lf), s in self.canonical.items()
                   if m == module and p == projection and split_axis(shard, s, role_of(lf)) is not None]
        coarsest = min(extents)
        return shape[axis] // coarsest if shape[axis] % coarsest == 0 else 1


def expert_key(name: str) -> tuple[str, int, str, str] | None:
    """(experts module, expert, projection, leaf) of a per-expert checkpoint tensor name, else None."""
    head, _, leaf = name.rpartition(".")
    head, _, projection = head.rpartition(".")
    module, _, expert = head.rpartition(".")
    if not expert.isdigit() or not module.endswith(".experts"):
        return None
    return module, int(expert), projection, leaf


def impossible(ck: Checkpoint, ranks: int) -> str | None:
    """Why splitting the experts over `ranks` tensor-parallel ranks cannot be exact (None: it can): the first
    canonical tensor whose extent along its split axis is not a whole number of blocks per rank."""
    if ranks == 1:
        return None
    for (module, projection, leaf), shape in sorted(ck.canonical.items()):
        shard = next((s for s, names in SHARDS.items() if projection in names), None)
        axis = split_axis(shard, shape, role_of(leaf)) if shard else None
        if axis is None:
            continue
        unit = ck.unit(module, projection, leaf, shard)  # type: ignore[arg-type]
        if not part(shape[axis], 0, ranks, unit)[2]:
            return (f"{module}.*.{projection}.{leaf} {list(shape)}: {shape[axis]} along axis {axis} "
                    f"({shape[axis] // unit} blocks of {unit}) cannot be split evenly over {ranks} ranks")
    return None


def diagnose(held: torch.Tensor, candidates: Iterable[tuple[str, Callable[[], torch.Tensor]]]) -> str:
    """What a wrong slot holds instead: the first candidate part it equals, else how much differs."""
    for words, get in candidates:
        try:
            if same(held, get()):
                return f"holds {words} instead"
        except (RuntimeError, IndexError, ValueError):
            continue
    return "holds other data"
