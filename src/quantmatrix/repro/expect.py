"""What a repro script must know besides the checkpoint, as plain data: the matrix's expectations for the case's
cell (per arch where the matrix says so), the backends' read-sets, and for the engine checks the request the
engine child got, its environment and the night's reference data. Made when the bundle is made, with the matrix
and quantmatrix at hand; the script itself has neither."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantmatrix.adapter.versions import engine_platform
from quantmatrix.checkpoints import base, store
from quantmatrix.checks import e2e as checks_e2e
from quantmatrix.engine import references, runner
from quantmatrix.engine.protocol import ENGINE_ENV, MODE_ONLY_ENV
from quantmatrix.errors import ReproError
from quantmatrix.measure import hf
from quantmatrix.schema.model import Case, Cell, Matrix, TensorFinding

ENGINE_CHECKS = ("degeneration", "agreement", "mode_invariance", "task_accuracy")
_LAYER = ("resolves_to", "activation_scales", "moe_backend")
_KEYS = {
    "config_dispatch": ("resolves_to", "quant_method", "rejected_because"),
    "layer_dispatch": _LAYER,
    "post_load_audit": ("resolves_to", "audit"),
    "kernel_format": _LAYER,
    "observed_reads": (),
    "checkpoint_lint": ("lint",),
    "hf_reference": (),
    "dequant_logits": ("dequant_strays",),
    "device_identity": (),
    "degeneration": ("degeneration", "degenerate"),
    "agreement": ("degeneration", "agreement_top_k"),
    "mode_invariance": ("degeneration", "invariance_top_k"),
    "task_accuracy": ("degeneration",),
}
_WITH_BACKENDS = ("layer_dispatch", "post_load_audit", "kernel_format", "observed_reads")


def _plain(value: Any) -> Any:
    """An expectation as JSON data (a pinned finding becomes {code, tensor}; a path its text)."""
    if isinstance(value, TensorFinding):
        return {"code": value.code, "tensor": value.tensor}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return str(value) if isinstance(value, Path) else value


def expected(case: Case, matrix: Matrix) -> dict[str, Any]:
    """The matrix's expectations this case's check reads, each as it holds for the cell's arch (a value the
    matrix does not state is left out: the check would not read it either)."""
    check = case.check.name
    if check not in _KEYS:
        raise ReproError(f"check {check!r} has no repro observer (known: {', '.join(_KEYS)})")
    ck, arch = case.cell.checkpoint, case.cell.arch
    out: dict[str, Any] = {}
    for key in _KEYS[check]:
        value = ck.expectation(key, arch, default=None)
        if value is not None:
            out[key] = _plain(value)
    if check in _WITH_BACKENDS:
        out["backends"] = {b.name: {"reads": sorted(b.reads), "single_input_scale": b.single_input_scale,
                                    "label": b.label, "kernel_alphas": b.kernel_alphas}
                           for b in matrix.moe_backends.values()}
    if check == "post_load_audit":
        out["cell_words"] = f"{ck.producer} {ck.scheme.name} on {arch.describe()}"
    if check == "hf_reference":
        prompts, ids, in_memory = hf.factory_greedy(store.spec_of(ck))
        out.update(prompts=prompts, prompt_ids=ids, in_memory=in_memory)
    if check == "dequant_logits":
        out["prompts"] = base.prompts()
    if check in ENGINE_CHECKS:
        out.update(_engine_expected(case, matrix))
    return out


def _engine_expected(case: Case, matrix: Matrix) -> dict[str, Any]:
    """The night's reference data an engine check compares with."""
    e2e, ck, check = matrix.e2e, case.cell.checkpoint, case.check.name
    assert e2e is not None, "an engine check's matrix has an e2e section (the loader refuses one without)"
    size = engine_size(case.cell, matrix)
    if check == "agreement":
        return {"reference": _reference(e2e.references, case.cell, "outputs", size)}
    if check == "task_accuracy":
        spec = ck.expectation("accuracy")
        return {"tasks": checks_e2e.tasks(ck), "reference_accuracy": _reference(e2e.references, case.cell,
                                                                                "accuracy", size),
                "accuracy": {k: v for k, v in spec.items() if k != "tasks"}}
    if check == "mode_invariance":
        base_cell = Cell(ck, case.cell.arch, matrix.mode(e2e.reference_mode))
        run = night_run(engine_request(base_cell, matrix))
        if run is None or run.result is None:
            raise ReproError(f"{case.cell.id}: the night's run of the reference mode {e2e.reference_mode} is not in "
                             f"this host's engine store ({store.cache_root() / 'e2e'}): bundle it on the runner")
        return {"reference_mode": e2e.reference_mode, "base_outputs": run.greedy(), "base_routed": f"[{run.routed()}]"}
    return {}


def _reference(root: Path, cell: Cell, kind: str, size: str | None) -> dict[str, Any]:
    path = references.path(root, cell, kind, size)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReproError(f"{cell.id}: its {kind} reference {path} cannot be read: {e}") from None


def engine_size(cell: Cell, matrix: Matrix) -> str | None:
    """The twin size the engine ran on this platform (None: the checkpoint itself)."""
    plat = matrix.e2e.platforms.get(engine_platform()) if matrix.e2e else None
    size = plat.synthetic_size if plat else None
    return size if size is not None and store.twin(cell.checkpoint, size) is not None else None


def engine_checkpoint(cell: Cell, matrix: Matrix) -> Path:
    """The files the engine ran for the cell: the checkpoint, or its twin at the platform's size."""
    size = engine_size(cell, matrix)
    twin = store.twin(cell.checkpoint, size) if size is not None else None
    return twin if twin is not None else store.materialize(cell.checkpoint)


def engine_request(cell: Cell, matrix: Matrix) -> dict[str, Any]:
    """The request the engine child got for a cell on this host (runner.build_request)."""
    assert matrix.e2e is not None
    prompts = tuple(t["prompt"] for t in checks_e2e.tasks(cell.checkpoint))
    return runner.build_request(matrix.e2e, cell, engine_checkpoint(cell, matrix), engine_platform(), prompts)


def engine(case: Case, matrix: Matrix) -> dict[str, Any]:
    """What the script's engine start needs: the request less its model path (the bundle's checkpoint is used),
    and whether the mode works through quantmatrix's own plugins (then the script cannot show it)."""
    request = engine_request(case.cell, matrix)
    plugins = sorted(k for k in case.cell.mode.env if k in MODE_ONLY_ENV)
    return {"request": {k: v for k, v in request.items() if k != "model"},
            "needs_quantmatrix": ", ".join(f"{k}={case.cell.mode.env[k]}" for k in plugins)}


def environment(case: Case, matrix: Matrix) -> dict[str, str]:
    """The environment the observation runs under: the engine platform's and the mode's settings, as the
    engine child had them (less quantmatrix's own plugin switches, which need quantmatrix)."""
    env: dict[str, str] = {}
    if case.check.name in ENGINE_CHECKS and matrix.e2e is not None:
        plat = matrix.e2e.platforms.get(engine_platform())
        env.update(plat.env if plat else {})
        env.update(ENGINE_ENV)
    env.update({k: v for k, v in case.cell.mode.env.items() if k not in MODE_ONLY_ENV})
    return env


def night_run(request: dict[str, Any]) -> runner.GroupRun | None:
    """The newest saved engine run of this exact request in this host's engine stores."""
    found = sorted((store.cache_root() / "e2e").glob(f"*/{runner.group_key(request)}/run.json"),
                   key=lambda p: p.stat().st_mtime)
    return runner.load_run(found[-1]) if found else None
