"""Where each uninitialised read of an initcheck report landed: inside a parameter or buffer of the model (named
layer, tensor, element and, through the shape, expert and row), or in memory no record holds (scratch and
activations, counted per kernel). Many reads of one tensor by one kernel are one Hit; a tensor's hits are its
Finding. A measurement: what is silenced, and what fails, is the check's (checks.sanitize).

The records are engine.params' (two per model: as built and after process_weights_after_loading) or a `PARAMS`
line's (name -> [start, end, element size, shape], the H200 probe's form). The processed record's marker splits
the report: reads before it may touch either record's tensors (the seed bug's fold reads the built one's
input_scale), reads after it only the processed one's, so a freed tensor's address reused by an activation later
is not blamed on it. A read in the marker itself is the marker's, never counted.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from quantmatrix.adapter import roles
from quantmatrix.engine.protocol import BUILT, PROCESSED
from quantmatrix.errors import SanitizerLogError
from quantmatrix.measure.initcheck import Report, SanitizerLog

PRINTED = "printed"  # the stage of a PARAMS line's tensors (one record, no marker)


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A recorded parameter or buffer: its device byte range [ptr, ptr + nbytes) and how elements lie in it."""

    name: str
    kind: str
    ptr: int
    nbytes: int
    element_size: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str | None
    experts: int | None
    stage: str

    @property
    def layer(self) -> str:
        return self.name.rpartition(".")[0]

    @property
    def leaf(self) -> str:
        return self.name.rpartition(".")[2]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def elements(self, address: int, size: int) -> list[int]:
        """Flat (row-major) indices of the elements a read of `size` bytes at `address` touches."""
        first = (address - self.ptr) // self.element_size
        last = (min(address + max(size, 1), self.ptr + self.nbytes) - 1 - self.ptr) // self.element_size
        out = []
        for offset in range(first, last + 1):
            coords = self.coords(offset)
            if coords is not None:
                out.append(_flat(coords, self.shape))
        return out

    def coords(self, offset: int) -> tuple[int, ...] | None:
        """The index of the element `offset` elements past data_ptr (None: a gap of a strided view)."""
        coords = [0] * len(self.shape)
        for d in sorted(range(len(self.shape)), key=lambda d: -self.stride[d]):
            if self.stride[d] == 0:
                continue
            coords[d], offset = divmod(offset, self.stride[d])
            if coords[d] >= self.shape[d]:
                return None
        return tuple(coords) if offset == 0 else None


def _flat(coords: tuple[int, ...], shape: tuple[int, ...]) -> int:
    index = 0
    for c, n in zip(coords, shape, strict=True):
        index = index * n + c
    return index


def contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


# ------------------------------------------------------------------------------------------ records


def _int(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise SanitizerLogError(f"{what}: expected a non-negative integer, got {value!r}")
    return value


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise SanitizerLogError(f"{what}: expected a list of integers, got {value!r}")
    return tuple(_int(v, what) for v in value)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)[:40]


def from_record(entries: Any, stage: str, where: str) -> list[Tensor]:
    """engine.params' entries, checked field by field (a record file is input like any other)."""
    if not isinstance(entries, list):
        raise SanitizerLogError(f"{where}: expected a list of tensors, got {type(entries).__name__}")
    out = []
    for i, e in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            raise SanitizerLogError(f"{at}: expected an object with a name")
        shape = _ints(e.get("shape"), f"{at}.shape")
        stride = _ints(e.get("stride"), f"{at}.stride") if e.get("stride") is not None else contiguous(shape)
        experts = e.get("experts")
        out.append(Tensor(e["name"], str(e.get("kind", "parameter")), _int(e.get("ptr"), f"{at}.ptr"),
                          _int(e.get("nbytes"), f"{at}.nbytes"), max(1, _int(e.get("element_size"), f"{at}.size")),
                          shape, stride if len(stride) == len(shape) else contiguous(shape), _text(e.get("dtype")),
                          None if experts is None else _int(experts, f"{at}.experts"), stage))
    return out


def from_params_line(params: dict[str, Any], where: str) -> list[Tensor]:
    """A `PARAMS` line: name -> [start, end, element size, shape]; a fused expert tensor (by vLLM's naming, which
    the probe follows) holds its experts along dim 0."""
    out = []
    for name, value in params.items():
        if not (isinstance(value, list) and len(value) == 4):
            raise SanitizerLogError(f"{where}: {name}: expected [start, end, element size, shape], got {value!r}")
        start, end = _int(value[0], f"{where}: {name} start"), _int(value[1], f"{where}: {name} end")
        size, shape = _int(value[2], f"{where}: {name} element size"), _ints(value[3], f"{where}: {name} shape")
        if end < start or size == 0:
            raise SanitizerLogError(f"{where}: {name}: end {end} before start {start}, or element size 0")
        experts = shape[0] if shape and roles.is_fused_expert(name) else None
        out.append(Tensor(name, "parameter", start, end - start, size, shape, contiguous(shape), None, experts,
                          PRINTED))
    return out


@dataclasses.dataclass(frozen=True)
class Record:
    """One process's tensors: both stages' (or a PARAMS line's), and the processed record's marker range."""

    tensors: tuple[Tensor, ...]
    marker: tuple[int, int] | None
    pid: int | None = None

    @property
    def processed(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors if t.stage != BUILT)


def worker_record(state: Any, where: str) -> Record:
    """engine.params' STATE of one worker (as engine.inspect returns it) as a Record."""
    if not isinstance(state, dict) or not isinstance(state.get("records"), list):
        raise SanitizerLogError(f"{where}: not a parameter record (an object with `records`)")
    tensors: list[Tensor] = []
    marker = None
    for i, rec in enumerate(state["records"]):
        if not isinstance(rec, dict) or rec.get("stage") not in (BUILT, PROCESSED):
            raise SanitizerLogError(f"{where}.records[{i}]: expected a stage {BUILT!r} or {PROCESSED!r}")
        tensors += from_record(rec.get("tensors"), rec["stage"], f"{where}.records[{i}].tensors")
        m = rec.get("marker")
        if isinstance(m, dict):
            marker = (_int(m.get("ptr"), f"{where}.records[{i}].marker"), _int(m.get("nbytes"), f"{where}.marker"))
    pid = state.get("pid")
    return Record(tuple(tensors), marker, pid if type(pid) is int else None)


# ------------------------------------------------------------------------------------------ mapping


class Index:
    """Address -> the recorded tensors whose byte range holds it (interval stabbing over ranges sorted by start;
    identical ranges, tied weights, are one entry under the first name)."""

    def __init__(self, tensors: Iterable[Tensor]) -> None:
        unique: dict[tuple[int, int], Tensor] = {}
        for t in tensors:
            if t.nbytes > 0:
                unique.setdefault((t.ptr, t.nbytes), t)
        self.tensors = sorted(unique.values(), key=lambda t: t.ptr)
        self.starts = [t.ptr for t in self.tensors]
        self.reach, end = [], -1
        for t in self.tensors:
            end = max(end, t.ptr + t.nbytes)
            self.reach.append(end)

    def find(self, address: int) -> list[Tensor]:
        out = []
        i = bisect.bisect_right(self.starts, address) - 1
        while i >= 0 and self.reach[i] > address:
            t = self.tensors[i]
            if address < t.ptr + t.nbytes:
                out.append(t)
            i -= 1
        return out


@dataclasses.dataclass(frozen=True)
class Hit:
    """Reads of one recorded tensor by one kernel: how many, which elements, and the first Python frame that
    launched one (where the host backtrace names it)."""

    tensor: Tensor
    kernel: str
    reads: int
    elements: frozenset[int]
    launched_from: str | None


@dataclasses.dataclass(frozen=True)
class Uninit:
    """One report mapped through one record: hits inside recorded tensors, reads elsewhere per kernel, and
    whether the marker ordered the report (`marker_at`: the index of its first read, None: order unknown), and how
    many reports the sanitizer withheld."""

    source: str
    reports: int
    hits: tuple[Hit, ...]
    other: dict[str, int]
    marker_at: int | None
    tensors: int
    withheld: int = 0  # reports the sanitizer counted but did not print (--print-limit): never mapped


def _marker_at(reports: tuple[Report, ...], marker: tuple[int, int] | None) -> int | None:
    if marker is None:
        return None
    lo, hi = marker[0], marker[0] + marker[1]
    return next((i for i, r in enumerate(reports) if lo <= r.address < hi), None)


def _frame(report: Report) -> str | None:
    return next((f for f in report.frames if ".py:" in f), None)


def map_reports(log: SanitizerLog, record: Record) -> Uninit:
    """Every report of `log` located through `record` (see the module's note on the marker)."""
    marker_at = _marker_at(log.reports, record.marker)
    before = Index(sorted(record.tensors, key=lambda t: t.stage != BUILT))  # built first: the seed's read
    after = Index(record.processed) if marker_at is not None else before
    lo, hi = (record.marker[0], record.marker[0] + record.marker[1]) if record.marker else (0, 0)
    hits: dict[tuple[Tensor, str], list[Any]] = {}
    other: collections.Counter[str] = collections.Counter()
    for i, r in enumerate(log.reports):
        if lo <= r.address < hi:
            continue
        # where a processed tensor reuses a built one's freed memory, the built one is the read's owner: the
        # seed's read is at load, and without a marker that is the only order known
        found = sorted((before if marker_at is None or i < marker_at else after).find(r.address),
                       key=lambda t: t.stage != BUILT)
        if not found:
            other[r.kernel] += 1
            continue
        entry = hits.setdefault((found[0], r.kernel), [0, set(), _frame(r)])
        entry[0] += 1
        entry[1].update(found[0].elements(r.address, r.size))
    out = tuple(Hit(t, k, n, frozenset(els), frame) for (t, k), (n, els, frame) in hits.items())
    return Uninit(log.source, len(log.reports), out, dict(other), marker_at, len(record.tensors), log.not_printed)


# ------------------------------------------------------------------------------------------ findings


@dataclasses.dataclass(frozen=True)
class Finding:
    """Every hit on one tensor: the unit a failure names (layer, tensor, experts, rows, kernels)."""

    tensor: Tensor
    hits: tuple[Hit, ...]

    @property
    def reads(self) -> int:
        return sum(h.reads for h in self.hits)

    @property
    def elements(self) -> frozenset[int]:
        return frozenset().union(*(h.elements for h in self.hits))

    def coords(self) -> list[tuple[int, ...]]:
        shape = self.tensor.shape
        return [_unflat(i, shape) for i in sorted(self.elements)]

    @property
    def experts(self) -> list[int]:
        if not self.tensor.experts or not self.tensor.shape:
            return []
        return sorted({c[0] for c in self.coords()})

    @property
    def rows(self) -> list[int]:
        """The index along the dim after the experts (w13's gate/up half, a weight's output row)."""
        dim = 1 if self.tensor.experts else 0
        return sorted({c[dim] for c in self.coords() if len(c) > dim})


def _unflat(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    coords = []
    for n in reversed(shape):
        index, c = divmod(index, max(n, 1))
        coords.append(c)
    return tuple(reversed(coords))


def findings(hits: Iterable[Hit]) -> list[Finding]:
    """Hits grouped per tensor, in the order of the record's names (stable across runs)."""
    by: dict[Tensor, list[Hit]] = {}
    for h in hits:
        by.setdefault(h.tensor, []).append(h)
    return [Finding(t, tuple(sorted(hs, key=lambda h: -h.reads))) for t, hs in sorted(by.items(),
                                                                                      key=lambda x: x[0].name)]


def ranges(values: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out: list[str] = []
    vals = sorted(set(values))
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ", ".join(out)
