"""Does the vLLM under test work here? Checked once, with a time limit, before any case imports it: a broken
install (a nightly wheel whose flashinfer needs other CUDA bindings, an import that hangs or segfaults) is then
one named cause, not a thousand per-case import errors.

`python -m quantmatrix.adapter.health [--within S] PART...` imports what each part of the adapter needs and
prints one `QMHEALTH {json}` line per step; the parent (`check`) reads them, and where the child hung or died
it names the module that was being imported, with the last frames faulthandler dumped. `check_here` takes the
same steps in the calling process, for one that imports vLLM next anyway (pytest_plugin.health says when)."""

from __future__ import annotations

import dataclasses
import faulthandler
import importlib
import json
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from quantmatrix.adapter import config, engine, layers
from quantmatrix.adapter.versions import package_versions, require_supported

# Each part of vLLM the adapter uses, as the modules it imports (kept beside the code that imports them).
PARTS: dict[str, tuple[str, ...]] = {"config": config.MODULES, "layers": layers.MODULES, "engine": engine.MODULES}
_TAG = "QMHEALTH "
_FRAMES = 6


@dataclasses.dataclass(frozen=True)
class Part:
    """One part's result: ok, or the step that failed (`module`) and why, with the last frames."""

    ok: bool
    cause: str = ""
    module: str = ""
    frames: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Health:
    """The vLLM under test as the health child found it."""

    parts: Mapping[str, Part]
    packages: Mapping[str, str]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.parts.values())

    def broken(self, needs: Iterable[str]) -> list[str]:
        return [n for n in needs if n in self.parts and not self.parts[n].ok]

    def versions_text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.packages.items() if v != "not installed")

    def cause(self, part: str) -> str:
        p = self.parts[part]
        return f"{p.module}: {p.cause}" if p.module else p.cause

    def message(self, needs: Iterable[str]) -> str | None:
        """The one shared message for every case needing a broken part (None when all it needs works)."""
        bad = self.broken(needs)
        if not bad:
            return None
        causes = "; ".join(f"{n} ({self.cause(n)})" for n in bad)
        return f"vLLM under test broken, not tested: {causes} [{self.versions_text()}]"

    def record(self) -> str:
        """The `vllm_health` record: `ok (...)` or `broken: part (cause); ...`."""
        if self.ok:
            return f"ok ({', '.join(self.parts)} imported in {self.seconds:.1f} s; {self.versions_text()})"
        return "broken: " + "; ".join(f"{n} ({self.cause(n)})" for n in self.broken(self.parts))

    def detail(self) -> list[str]:
        """The record, then each broken part's last frames: for the terminal and `quantmatrix detect`."""
        lines = [f"vllm_health: {self.record()}"]
        for name in self.broken(self.parts):
            lines += [f"  {name}: last frames:"] + [f"    {f}" for f in self.parts[name].frames]
        return lines

    def to_json(self) -> str:
        return json.dumps({"parts": {k: dataclasses.asdict(v) for k, v in self.parts.items()},
                           "packages": dict(self.packages), "seconds": self.seconds})

    @classmethod
    def from_json(cls, text: str) -> Health:
        d = json.loads(text)
        parts = {k: Part(v["ok"], v["cause"], v["module"], tuple(v["frames"])) for k, v in d["parts"].items()}
        return cls(parts, d["packages"], d["seconds"])


def _say(**event: Any) -> None:
    print(_TAG + json.dumps(event), flush=True)


def _frames(tb: Any) -> list[str]:
    frames = [f for f in traceback.extract_tb(tb) if not f.filename.startswith("<frozen")]
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in frames[-_FRAMES:]]


def _failing_import(tb: Any) -> str | None:
    """The innermost module being imported when it raised (read from importlib's own frames)."""
    name = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.startswith("<frozen importlib") and code.co_name == "_find_and_load":
            name = tb.tb_frame.f_locals.get("name", name)
        tb = tb.tb_next
    return name


def _step(module: str) -> None:
    require_supported()  # a vLLM older than the adapter knows is broken for quantmatrix, whatever imports
    importlib.import_module(module)
    if module == "vllm.model_executor.layers.quantization":  # its quant classes are imported when asked for
        get = importlib.import_module(module).get_quantization_config
        for method in config.METHODS:
            get(method)


def _steps(parts: list[str], say: Callable[..., None]) -> None:
    """Import each part's modules in order, telling `say` each step's begin and each part's ok or failure."""
    for part in parts:
        for module in PARTS[part]:
            say(begin=part, module=module)
            try:
                _step(module)
            except BaseException as e:  # noqa: BLE001 - anything an import raises is the verdict
                inner = _failing_import(e.__traceback__)
                where = f"import {inner}" + (f" (inside {module})" if inner != module else "") if inner else module
                say(fail=part, module=where, cause=f"{type(e).__name__}: {e}"[:500], frames=_frames(e.__traceback__))
                break
        else:
            say(ok=part)


def child(parts: list[str], within: float) -> int:
    """The steps, printed; a hang past `within` s dumps every thread's stack and exits."""
    faulthandler.enable()
    faulthandler.dump_traceback_later(within, exit=True)
    _steps(parts, _say)
    return 0


def _events(stdout: str) -> list[dict[str, Any]]:
    out = []
    for line in stdout.splitlines():
        if line.startswith(_TAG):
            try:
                out.append(json.loads(line[len(_TAG):]))
            except json.JSONDecodeError:
                continue
    return out


def _death(returncode: int | None, within: float) -> str:
    if returncode is None or returncode == 1:  # killed by us, or faulthandler's exit after dumping
        return f"hung: no answer within {within:.0f} s"
    if returncode < 0:
        sig = -returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "unknown"
        return f"crashed the process (signal {sig}: {name})"
    return f"the process exited {returncode}"


def _dumped(stderr: str) -> tuple[str, ...]:
    """The innermost frames faulthandler printed (it lists the innermost call first)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip().startswith("File ")]
    return tuple(lines[:_FRAMES])


def _run_child(parts: list[str], within: float) -> tuple[list[dict[str, Any]], int | None, str]:
    argv = [sys.executable, "-m", "quantmatrix.adapter.health", "--within", f"{within:.1f}", *parts]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=within + 10)
        return _events(proc.stdout), proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return _events(out), None, err


def _fold(events: list[dict[str, Any]], results: dict[str, Part]) -> dict[str, Any] | None:
    """Each part's verdict from the events into `results`; the step still open at the end (a hang or a death)."""
    current: dict[str, Any] | None = None
    for ev in events:
        if "begin" in ev:
            current = ev
        elif "ok" in ev:
            results[ev["ok"]], current = Part(True), None
        elif "fail" in ev:
            results[ev["fail"]] = Part(False, ev["cause"], ev["module"], tuple(ev["frames"]))
            current = None
    return current


def check(timeout: float = 120.0, parts: Iterable[str] = tuple(PARTS)) -> Health:
    """Every part's verdict; after a hang or a crash the parts not yet reached get a fresh child (time allowing)."""
    start = time.monotonic()
    results: dict[str, Part] = {}
    pending = list(parts)
    while pending:
        left = timeout - (time.monotonic() - start)
        if left <= 1:
            for p in pending:
                results[p] = Part(False, "not checked: the health check ran out of time on an earlier part")
            break
        events, rc, stderr = _run_child(pending, left)
        current = _fold(events, results)
        if current is not None:  # the child hung or died inside this step
            results[current["begin"]] = Part(False, _death(rc, left), current["module"], _dumped(stderr))
        elif rc != 0 and not events:
            tail = stderr.strip().splitlines()[-3:]
            for p in pending:
                results[p] = Part(False, f"{_death(rc, left)} before importing anything", "", tuple(tail))
        pending = [p for p in pending if p not in results]
    return Health({p: results[p] for p in parts}, package_versions(), round(time.monotonic() - start, 2))


def check_here(timeout: float = 120.0, parts: Iterable[str] = tuple(PARTS)) -> Health:
    """The same steps in this process, for a process that imports vLLM next anyway (the import is then paid once,
    not once in a child and again here). They run in a daemon thread, so an import that hangs is cut at `timeout`
    and named with the frames it hangs in (the thread is left behind); an import that crashes the interpreter
    cannot be survived here, which is why the caller marks the attempt (pytest_plugin.health)."""
    parts, events, start = list(parts), [], time.monotonic()
    worker = threading.Thread(target=_steps, args=(parts, lambda **ev: events.append(ev)), daemon=True,
                              name="quantmatrix-vllm-health")
    worker.start()
    worker.join(timeout)
    results: dict[str, Part] = {}
    current = _fold(list(events), results)
    if worker.is_alive() and current is not None:
        stack = traceback.extract_stack(sys._current_frames()[worker.ident])  # type: ignore[index]
        frames = tuple(f"{f.filename}:{f.lineno} in {f.name}" for f in stack[-_FRAMES:])
        results[current["begin"]] = Part(False, f"hung: no answer within {timeout:.0f} s", current["module"], frames)
    for p in parts:
        results.setdefault(p, Part(False, "not checked: the health check ran out of time on an earlier part"))
    return Health({p: results[p] for p in parts}, package_versions(), round(time.monotonic() - start, 2))


def absent(parts: Iterable[str] = tuple(PARTS)) -> Health:
    """The verdict where vLLM is not installed at all, for a run that needs it (a GPU runner under
    --strict-hardware, `quantmatrix detect` on a GPU host): every part broken for that one reason."""
    why = f"vLLM is not installed: {sys.executable} finds no `vllm` package"
    return Health({p: Part(False, why) for p in parts}, package_versions(), 0.0)


def main(argv: list[str]) -> int:
    within = 120.0
    if argv[:1] == ["--within"]:
        within, argv = float(argv[1]), argv[2:]
    unknown = [p for p in argv if p not in PARTS]
    if unknown:
        print(f"unknown part(s) {unknown}; known: {list(PARTS)}", file=sys.stderr)
        return 2
    return child(argv or list(PARTS), within)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
