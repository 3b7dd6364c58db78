"""Shared by the report tests: real JUnit files, written by pytest running small generated suites.

The generated conftest stands in for the quantmatrix plugin exactly where the report depends on it: it
adds the per-case properties through `item.user_properties` (so they travel with xdist reports), marks
waived cases `xfail(strict=False)`, and stamps host properties into the finished file from the controller
with `stamp_testsuite_properties` (trylast `pytest_sessionfinish`, after pytest's LogXML wrote it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from quantmatrix import properties as P

SRC = Path(__file__).resolve().parents[1] / "src"

PLUGIN_STANDIN = '''
import json
from pathlib import Path

import pytest

from quantmatrix import properties as P
from quantmatrix.pytest_plugin.junit import stamp_testsuite_properties

SPEC = json.loads((Path(__file__).parent / "spec.json").read_text())
HOST = SPEC["host"]
WAIVER = {P.WAIVER_REASON: "FlashInfer MoE NaN on GB10", P.WAIVER_LINK: "https://github.com/example/qm/issues/7"}


def _worker(config):
    """xdist's id of this worker, from its config (the environment variable leaks into in-process pytester runs
    when quantmatrix's own tests run under -n)."""
    return getattr(config, "workerinput", {}).get("workerid", "main")


def pytest_collection_modifyitems(items):
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "cell" not in params:
            continue
        cell = params["cell"]
        checkpoint, _, arch_mode = cell.rpartition("@")
        arch, _, mode = arch_mode.partition("-")
        mode, _, layout = mode.partition("-")  # a layout other than the serving one ends the cell id
        check = item.originalname.removeprefix("test_")
        behaviour = SPEC["outcomes"].get(f"{check}[{cell}]", "pass")
        props = {P.CHECKPOINT: checkpoint, P.SCHEME: SPEC["schemes"].get(checkpoint, "nvfp4_weight_only"),
                 P.PRODUCER: "modelopt", P.ARCH: arch, P.MODE: mode, P.LAYOUT: layout or "tp1", P.CHECK: check,
                 P.KIND: "e2e" if check.startswith("e2e") else "dispatch", P.TIER: "cpu", P.CELL: cell,
                 P.VLLM_VERSION: HOST[P.VLLM_VERSION], P.TORCH_VERSION: HOST[P.TORCH_VERSION],
                 P.PLATFORM: "cpu", P.DEVICE_NAME: SPEC["devices"].get(arch, ""), P.DEVICE_CAPABILITY: "",
                 P.RUNNER: HOST[P.RUNNER], "worker": _worker(item.config)}
        if behaviour in ("waive", "xpass", "stale"):
            props |= WAIVER | {P.WAIVER_EXPIRES: "2020-01-01" if behaviour == "stale" else "2099-12-31",
                               P.WAIVER_EXPIRED: "false"}
            item.add_marker(pytest.mark.xfail(strict=False, reason=WAIVER[P.WAIVER_REASON]))
        elif behaviour == "expired":
            props |= WAIVER | {P.WAIVER_EXPIRES: "2020-01-01", P.WAIVER_EXPIRED: "true"}
        item.user_properties.extend(props.items())


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    xml = session.config.option.xmlpath
    if xml and not hasattr(session.config, "workerinput"):
        stamp_testsuite_properties(Path(xml), HOST)
'''

SUITE_HEAD = '''
import json
from pathlib import Path

import pytest

from quantmatrix import properties as P

SPEC = json.loads((Path(__file__).parent / "spec.json").read_text())


@pytest.fixture(params=SPEC["cells"], ids=SPEC["cells"])
def cell(request):
    return request.param


@pytest.fixture
def behaviour(request, cell):
    b = SPEC["outcomes"].get(f"{request.node.originalname.removeprefix('test_')}[{cell}]", "pass")
    if b == "error":
        raise RuntimeError("engine start failed: out of GPU memory")
    yield b
    if b == "teardown_error":
        raise RuntimeError("engine shutdown hung")


def run_check(name, cell, behaviour, record_property):
    record_property(P.QUANT_METHOD, "modelopt_fp4")
    record_property(P.MOE_BACKEND, "flashinfer_cutlass")
    record_property("metric.max_abs_err", 0.0012)
    record_property("time.load", 0.25)
    tokens = SPEC["tokens"].get(f"{name}[{cell}]")
    if tokens is not None:
        record_property(P.GREEDY_TOKEN_IDS, P.encode_tokens(tokens))
    top = SPEC["top_k"].get(f"{name}[{cell}]")
    if top is not None:
        record_property(P.GREEDY_TOP_K, P.encode_top_k(P.TopK(top["k"], top["ranked"])))
    if behaviour == "skip":
        pytest.skip("needs 2 GPUs")
    if behaviour != "pass" and behaviour != "xpass":
        for step in range(60):
            print(f"engine step {step} on {cell}")
        assert False, f"{name} broke on {cell}"
'''

SUITE_CHECK = '''

def test_{check}(cell, behaviour, record_property):
    run_check("{check}", cell, behaviour, record_property)
'''

DEVICES = {"sm100": "NVIDIA B200", "sm120": "NVIDIA RTX PRO 6000 Blackwell", "sm121": "NVIDIA GB10",
           "sm90": "NVIDIA H100"}


class SuiteRunner:
    """Runs a generated suite with pytest and returns the JUnit file it wrote."""

    def __init__(self, pytester: pytest.Pytester) -> None:
        self.pytester = pytester
        self.junit = pytester.path / "junit"

    def run(self, name: str, cells: Iterable[str], *, checks: Sequence[str] = ("config_dispatch",),
            outcomes: Mapping[str, str] | None = None, tokens: Mapping[str, list[list[int]]] | None = None,
            top_k: Mapping[str, dict[str, Any]] | None = None,
            vllm: str = "0.11.1", runner: str = "runner-a", xdist: bool = False, args: Sequence[str] = (),
            family: str = "xunit1", extra_test: str = "", schemes: Mapping[str, str] | None = None,
            suite_props: Mapping[str, str] | None = None) -> pytest.RunResult:
        """`outcomes` maps 'check[cell]' to pass/fail/error/skip/waive/xpass/expired/stale/teardown_error;
        `tokens` and `top_k` ({k, ranked}) to the greedy output that case records; `suite_props` are more
        testsuite properties (a MATRIX_CASES record)."""
        spec = {"cells": list(cells), "outcomes": dict(outcomes or {}), "tokens": dict(tokens or {}),
                "top_k": dict(top_k or {}),
                "schemes": dict(schemes or {}), "devices": DEVICES,
                "host": {P.VLLM_VERSION: vllm, P.TORCH_VERSION: "2.9.1", P.RUNNER: runner, P.RUN_ID: name,
                         P.HOST_ARCH: "x86_64", P.DEVICE_NAME: "cpu", P.MATRIX: "matrix.yaml",
                         **(suite_props or {})}}
        (self.pytester.path / "spec.json").write_text(json.dumps(spec))
        self.pytester.makeconftest(PLUGIN_STANDIN)
        self.pytester.makepyfile(test_suite=SUITE_HEAD + "".join(SUITE_CHECK.format(check=c) for c in checks)
                                 + extra_test)
        self.last = self.junit / f"{name}.xml"
        argv = ["-p", "no:quantmatrix", "-p", "no:cacheprovider", f"--junitxml={self.last}",
                "-o", f"junit_family={family}", *args]
        if xdist:
            result = self.pytester.runpytest_subprocess(*argv, "-n", "2")
        else:
            result = self.pytester.runpytest(*argv)
        assert self.last.is_file(), result.stdout.str()
        return result


def _one_disagreement(summary: Mapping[str, Any], md: str, arch: str, red: bool) -> str:
    """The night's single cross-arch disagreement: `arch`'s alone, red or a near-tie alike in summary.json (its
    entry and exit_code) and in matrix.md's line for it (❌ or ≈); returns its detail."""
    (d,) = summary["disagreements"]
    assert (d["red"], [(x["arch"], x["red"]) for x in d["differs"]]) == (red, [(arch, red)])
    assert summary["exit_code"] == int(red)
    (line,) = [row for row in md.splitlines() if row.startswith("- ") and f" {arch} (" in row]
    assert line.startswith("- ❌ " if red else "- ≈ "), line
    return d["differs"][0]["detail"]


@pytest.fixture
def one_disagreement() -> Callable[[Mapping[str, Any], str, str, bool], str]:
    """Checks the night's single cross-arch disagreement (see _one_disagreement) and returns its detail."""
    return _one_disagreement


@pytest.fixture
def junit_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> SuiteRunner:
    # Subprocess runs (xdist) must import quantmatrix from this checkout whatever the cwd.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    return SuiteRunner(pytester)


@pytest.fixture(autouse=True)
def _no_hypothesis_plugin_in_the_runs_a_test_starts(request: pytest.FixtureRequest,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The pytest runs a pytester test starts load no hypothesis plugin: it imports hypothesis at each session's
    end (~2 s of every subprocess run here), and none of the generated suites uses it."""
    if "pytester" in request.fixturenames:
        opts = os.environ.get("PYTEST_ADDOPTS", "")
        monkeypatch.setenv("PYTEST_ADDOPTS", f"{opts} -p no:hypothesispytest".strip())


# Packages that register types and ops with torch once per process (and torch itself): kept across in-process runs.
_REGISTER_WITH_TORCH = ("vllm", "torch", "zentorch", "triton", "flashinfer")


@pytest.fixture(autouse=True)
def _vllm_outlives_in_process_runs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM registers its types and ops with torch once per process. An in-process pytester run that imported it
    first would drop it from sys.modules afterwards (pytester restores its snapshot), and the next import in this
    process dies ("... is already registered as an opaque type"). pytester's snapshot keeps such packages."""
    if "pytester" not in request.fixturenames:
        return
    from _pytest import pytester

    snapshot = pytester.SysModulesSnapshot.__init__

    def keeping(self: Any, preserve: Callable[[str], bool] | None = None) -> None:
        def kept(name: str) -> bool:
            return name.partition(".")[0] in _REGISTER_WITH_TORCH or bool(preserve and preserve(name))

        snapshot(self, kept)

    monkeypatch.setattr(pytester.SysModulesSnapshot, "__init__", keeping)
