"""A repro bundle: one red cell as a folder a vLLM developer can act on without quantmatrix.

    repro.py         the standalone script (repro.script): exit 0 fixed, 1 still failing, 2 cannot observe here
    case.json        everything the bundle knows: case, failure, expectations, the vLLM under test, the checkpoint
    ISSUE.md         an issue body (repro.issue)
    environment.txt  what `vllm collect-env` printed on the host that made the bundle, secrets removed
    checkpoint/      the checkpoint's files when small (else case.json's recipe: matrix entry, spec, hub commit)
    base/            dequant_logits only: the bf16 model the checkpoint was quantized from
    engine/          engine checks only: the night's engine log (its tail), request and result, size-capped

The folder is built beside its final place and renamed into it, so a bundle is whole or absent.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib.metadata
import shutil
import tempfile
from pathlib import Path
from typing import Any

from quantmatrix import properties as P
from quantmatrix.adapter.environment import collect_env
from quantmatrix.adapter.versions import install_command, install_spec
from quantmatrix.atomic import dump_json, write_atomic
from quantmatrix.checkpoints import store
from quantmatrix.errors import ReproError
from quantmatrix.repro import CHECKPOINT_CAP, expect, issue, script
from quantmatrix.repro.record import Record, vllm_of
from quantmatrix.repro.secrets import scrub, secret_file
from quantmatrix.schema.model import Case, Checkpoint, Matrix

LOG_CAP = 1 << 20  # the engine log's last bytes kept
RESULT_CAP = 4 << 20  # request/result files above this are left out (named in case.json)
VENV = "repro-venv"
_HOST = frozenset({P.VLLM_VERSION, P.VLLM_DISTRIBUTION, P.VLLM_COMMIT, P.VLLM_WHEEL, P.TORCH_VERSION, P.PLATFORM,
                   P.RUNNER, P.DEVICE_NAME, P.DEVICE_CAPABILITY})
_CHECKPOINT_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja")


@dataclasses.dataclass(frozen=True)
class Options:
    checkpoint_cap: int = CHECKPOINT_CAP
    environment: bool = True  # run `vllm collect-env` (seconds: it imports torch)


def case_of(matrix: Matrix, record: Record) -> Case:
    """The matrix case a record is of (its check and cell properties, else its name)."""
    check_name = record.prop(P.CHECK) or record.key.rpartition("::")[2].partition("[")[0].removeprefix("test_")
    cell_id = record.prop(P.CELL) or record.key.partition("[")[2].rstrip("]").rsplit("]@", 1)[0]
    check = matrix.checks.get(check_name)
    if check is None:
        raise ReproError(f"{record.key}: the matrix {matrix.path} has no check {check_name!r}")
    for case in matrix.cases(check):
        if case.cell.id == cell_id:
            return case
    raise ReproError(f"{record.key}: no cell {cell_id!r} of check {check_name} in the matrix {matrix.path}")


def make(record: Record, matrix: Matrix, out: Path, options: Options | None = None) -> Path:
    """Write the bundle of `record` to `out` (replacing an older one) and return `out`."""
    options = options or Options()
    case = case_of(matrix, record)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        data = case_data(record, case, matrix)
        data["checkpoint"] = _checkpoint(case, matrix, record, tmp, options)
        if case.check.name in expect.ENGINE_CHECKS:
            data["engine_files"] = _engine_files(record, tmp / "engine")
        (tmp / "repro.py").write_text(script.write(data), encoding="utf-8")
        (tmp / "repro.py").chmod(0o755)
        if options.environment:
            text, problem = _environment()
            data["environment"] = problem or "collected"
            (tmp / "environment.txt").write_text(scrub(text + (f"\n[{problem}]\n" if problem else "")),
                                                 encoding="utf-8")
        write_atomic(tmp / "case.json", dump_json(data))
        (tmp / "ISSUE.md").write_text(issue.body(data), encoding="utf-8")
        tmp.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@functools.cache
def _environment() -> tuple[str, str | None]:
    """`vllm collect-env` once per process: every bundle a run makes is of the same host."""
    return collect_env()


def case_data(record: Record, case: Case, matrix: Matrix) -> dict[str, Any]:
    """The bundle's case.json (less the checkpoint and the files), which the script carries as CASE."""
    cell, check = case.cell, case.check
    vllm = vllm_of(record)
    spec = install_spec(vllm[P.VLLM_VERSION], vllm[P.VLLM_DISTRIBUTION], vllm[P.VLLM_WHEEL])
    data: dict[str, Any] = {
        "key": record.key, "nodeid": record.nodeid, "cell": cell.id, "check": check.name, "kind": check.kind,
        "heading": f"{cell.id} {check.name}", "title": check.description, "outcome": record.outcome,
        "message": scrub(record.message), "log_tail": scrub(record.log_tail),
        "arch": {"name": cell.arch.name, "capability": list(cell.arch.capability), "label": cell.arch.label,
                 "describe": cell.arch.describe()},
        "mode": {"name": cell.mode.name, "env": dict(cell.mode.env), "engine_args": dict(cell.mode.engine_args)},
        "expected": expect.expected(case, matrix),
        "recorded": {k: scrub(v) for k, v in record.props.items() if k not in P.CELL_PROPERTIES | _HOST},
        "vllm": {**vllm, "install_spec": spec, "install": install_command(spec, vllm[P.VLLM_DISTRIBUTION], VENV)},
        "env": expect.environment(case, matrix),
        "matrix": {"path": str(matrix.path), "run_id": record.prop(P.RUN_ID), "runner": record.prop(P.RUNNER),
                   "device": record.prop(P.DEVICE_NAME)},
        "made_by": {"quantmatrix": importlib.metadata.version("quantmatrix"), "from": record.source,
                    "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
    }
    if check.name in expect.ENGINE_CHECKS:
        data["engine"] = expect.engine(case, matrix)
    return data


def _checkpoint(case: Case, matrix: Matrix, record: Record, bundle: Path, options: Options) -> dict[str, Any]:
    """The checkpoint's recipe, and its files (and dequant_logits' bf16 base) in the bundle when they are small."""
    ck = case.cell.checkpoint
    recipe = _recipe(ck, record)
    if case.check.name in expect.ENGINE_CHECKS:
        path = expect.engine_checkpoint(case.cell, matrix)
    elif ck.source.kind == "synthetic" or ck.source.kind == "path":
        path = store.materialize(ck)
    else:
        return recipe  # a hub checkpoint is its id and commit: `hf download` puts it where --checkpoint reads
    recipe["files"] = _copy_small(path, bundle / "checkpoint", options.checkpoint_cap)
    if recipe["files"]:
        recipe["how"] = "the files are in checkpoint/ beside repro.py"
    if case.check.name == "dequant_logits":
        recipe["base_files"] = _copy_small(store.base_of(ck), bundle / "base", options.checkpoint_cap)
    return recipe


def _recipe(ck: Checkpoint, record: Record) -> dict[str, Any]:
    """How to get the checkpoint again: the matrix entry, and its factory spec, hub commit or path."""
    out: dict[str, Any] = {"id": ck.id, "producer": ck.producer, "scheme": ck.scheme.name, "label": ck.label,
                           "matrix_entry": ck.where, "source": ck.source.kind}
    if ck.source.kind == "synthetic":
        spec = store.spec_of(ck)
        out.update(spec=dataclasses.asdict(spec), factory_version=store.FACTORY_VERSION, digest=store.digest(spec),
                   how=f"quantmatrix checkpoint make {ck.id} --out checkpoint (with the matrix that names it)")
    elif ck.source.kind == "hub":
        repo, revision = ck.source.value
        commit = record.prop(P.CHECKPOINT_SNAPSHOT) or revision
        out.update(repo=repo, revision=revision, commit=commit,
                   how=f"{store.download_command(repo, commit)}, then pass its snapshot folder as --checkpoint")
    else:
        out.update(path=str(ck.source.value), how=f"the files at {ck.source.value} on the runner; pass --checkpoint")
    return out


def _copy_small(source: Path, dest: Path, cap: int) -> list[str]:
    """Copy a checkpoint's files (no subfolders, never a secret file) when they add up to at most `cap` bytes;
    [] when they do not (the recipe says how to get them)."""
    files = sorted({f for pattern in _CHECKPOINT_FILES for f in source.glob(pattern)
                    if f.is_file() and not secret_file(f)})
    if not files or sum(f.stat().st_size for f in files) > cap:
        return []
    dest.mkdir()
    for f in files:
        shutil.copyfile(f, dest / f.name)
    return [f.name for f in files]


def _engine_files(record: Record, dest: Path) -> dict[str, str]:
    """The night's engine log (its last LOG_CAP bytes), request and result, from this host's engine store, each
    with secrets removed; what was not found or too big is said instead."""
    group = record.prop(P.ENGINE_GROUP)
    found = sorted((store.cache_root() / "e2e").glob(f"*/{group}"), key=lambda p: p.stat().st_mtime) if group else []
    if not found:
        return {"engine/": f"no engine run {group or '(none recorded)'} in this host's engine store"}
    dest.mkdir()
    said: dict[str, str] = {}
    for name, cap in (("engine.log", LOG_CAP), ("request.json", RESULT_CAP), ("result.json", RESULT_CAP)):
        f = found[-1] / name
        if not f.is_file():
            said[name] = "absent"
            continue
        data = f.read_bytes()
        if name != "engine.log" and len(data) > cap:
            said[name] = f"left out: {len(data)} bytes > {cap}"
            continue
        text = data[-cap:].decode("utf-8", "replace")
        (dest / name).write_text(scrub(text), encoding="utf-8")
        said[name] = "the last 1 MiB" if len(data) > cap else "whole"
    return said
