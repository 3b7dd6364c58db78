"""`quantmatrix bisect` against fake releases: tiny `vllm` wheels whose behaviour flips at a chosen version, in a
local index (PEP 503 pages over file://) or a wheel folder, installed by real uv into real venvs (offline), and a
one-case suite run by real pytest in each, its verdict read from real JUnit. quantmatrix and its requirements
come from this environment, repacked as wheels, exactly as the CLI does it."""

from __future__ import annotations

import importlib.metadata
import json
import zipfile
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from quantmatrix import properties as P
from quantmatrix.bisect import candidates as cand
from quantmatrix.bisect.check import read_junit
from quantmatrix.bisect.repack import repack
from quantmatrix.bisect.session import Bisect, Plan, default_recipe
from quantmatrix.bisect.summary import range_from_report
from quantmatrix.bisect.venvs import Sources, VenvCache
from quantmatrix.cli import main
from quantmatrix.errors import BisectError

# What each fake release does: "weight_only" (the right scheme), "w4a4" (the bug), "error" (its measurement
# raises: an error in setup), "uninstallable" (requires a package no index has).
SUITE = '''
import pytest


@pytest.fixture
def measured():
    import vllm  # at run time, as the real checks do: collecting the case imports no vLLM

    return vllm.__version__, vllm.resolve_scheme()  # raising here is an error in setup, not a failure


def test_dispatch(measured):
    version, scheme = measured
    assert scheme == "weight_only", f"vllm {version} routed the weight-only checkpoint to {scheme}"
'''


def _fake_vllm(out: Path, version: str, behaviour: str) -> Path:
    """A wheel of a `vllm` whose resolve_scheme() gives `behaviour` (or raises, or cannot install)."""
    body = (f"__version__ = {version!r}\n\n\ndef resolve_scheme():\n" +
            ("    raise RuntimeError('the MoE oracle crashed')\n" if behaviour == "error" else
             f"    return {behaviour!r}\n"))
    meta = f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    if behaviour == "uninstallable":
        meta += "Requires-Dist: quantmatrix-no-such-package>=1\n"
    info = f"vllm-{version}.dist-info"
    path = out / f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("vllm/__init__.py", body)
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"vllm/__init__.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return path


def _closure(names: list[str]) -> list[str]:
    """These distributions and what they need here, markers evaluated for this interpreter."""
    env, seen, todo = default_environment(), [], list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.append(name)
        for r in map(Requirement, importlib.metadata.requires(name) or ()):
            if r.marker is None or r.marker.evaluate({**env, "extra": ""}):
                todo.append(r.name)
    return seen


@pytest.fixture(scope="session")
def deps(tmp_path_factory) -> Path:
    """quantmatrix's runtime requirements as wheels (repacked from this environment): uv installs offline."""
    out = tmp_path_factory.mktemp("deps")
    roots = [Requirement(r).name for r in importlib.metadata.requires("quantmatrix") if "extra" not in r]
    for name in _closure(roots):
        repack(name, out)
    return out


@pytest.fixture(scope="session")
def recipe(tmp_path_factory):
    return default_recipe("vllm", tmp_path_factory.mktemp("qm"))


@pytest.fixture
def suite(tmp_path) -> Path:
    d = tmp_path / "suite"
    d.mkdir()
    (d / "test_fake.py").write_text(SUITE, encoding="utf-8")
    return d


def releases(folder: Path, behaviours: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for version, behaviour in behaviours.items():
        _fake_vllm(folder, version, behaviour)
    return folder


def simple_index(root: Path, wheels: Path) -> str:
    """A PEP 503 index over file:// whose vllm page links the wheels."""
    page = root / "vllm"
    page.mkdir(parents=True)
    links = "".join(f'<a href="{w.resolve().as_uri()}">{w.name}</a>\n' for w in sorted(wheels.glob("*.whl")))
    (page / "index.html").write_text(f"<html><body>\n{links}</body></html>\n", encoding="utf-8")
    return root.resolve().as_uri()


def flips(versions: list[str], at: str, before: str, after: str, **special: str) -> dict[str, str]:
    out = {v: (before if Version(v) < Version(at) else after) for v in versions}
    out.update({v.replace("_", "."): b for v, b in special.items()})
    return out


V7 = [f"0.{i}.0" for i in range(1, 8)]


def bisect(tmp_path: Path, suite: Path, recipe, deps: Path, good: str, bad: str, *, wheels: Path | None = None,
           index: str | None = None, cache: VenvCache | None = None, commit_index: str | None = None):
    sources = Sources(index_url=index, find_links=(str(deps),) + ((str(wheels),) if wheels else ()),
                      no_index=wheels is not None, offline=True)
    plan = Plan("test_fake.py::test_dispatch", "vllm", Version(good), Version(bad), suite, sources, recipe,
                tmp_path / "record.json", tmp_path / "bisect.log", wheels, commit_index, timeout_s=120)
    lines: list[str] = []
    record, code = Bisect(plan, cache or VenvCache(tmp_path / "venvs"), lines.append).run()
    assert json.loads((tmp_path / "record.json").read_text()) == record
    return record, code, "\n".join(lines)


def test_first_bad_release_from_a_simple_index_and_a_warm_cache_installs_nothing(tmp_path, suite, recipe, deps):
    wheels = releases(tmp_path / "files", flips(V7, "0.5.0", "weight_only", "w4a4"))
    index = simple_index(tmp_path / "simple", wheels)
    cache = VenvCache(tmp_path / "venvs")
    record, code, out = bisect(tmp_path, suite, recipe, deps, "0.1.0", "0.7.0", index=index, cache=cache)
    assert code == 0 and record["status"] == "found" and record["looking_for"] == "first bad"
    assert (record["last_unchanged"]["version"], record["first_changed"]["version"]) == ("0.4.0", "0.5.0")
    assert "routed the weight-only checkpoint to w4a4" in record["first_changed"]["said"]
    assert record["candidates"] == V7 and record["installs"] == len(record["tested"]) <= 5
    assert "first bad release of vllm: 0.5.0" in out and "0.5.0: installing" in out
    again, code, out = bisect(tmp_path, suite, recipe, deps, "0.1.0", "0.7.0", index=index, cache=cache)
    assert code == 0 and again["first_changed"]["version"] == "0.5.0"
    assert again["installs"] == 0 and "cached venv" in out and "installing" not in out


def test_first_good_release_from_a_wheel_folder(tmp_path, suite, recipe, deps):
    wheels = releases(tmp_path / "wheels", flips(V7, "0.3.0", "w4a4", "weight_only"))
    record, code, out = bisect(tmp_path, suite, recipe, deps, "0.7.0", "0.1.0", wheels=wheels)
    assert code == 0 and record["looking_for"] == "first good"
    assert record["first_changed"]["version"] == "0.3.0" and record["first_changed"]["outcome"] == "passed"
    assert record["last_unchanged"]["outcome"] == "failed"
    assert "first good release of vllm: 0.3.0" in out


def test_an_uninstallable_release_and_an_erroring_case_are_skipped_not_counted_good(tmp_path, suite, recipe, deps):
    behaviours = flips(V7, "0.6.0", "weight_only", "w4a4", **{"0_4_0": "uninstallable", "0_3_0": "error"})
    wheels = releases(tmp_path / "wheels", behaviours)
    record, code, out = bisect(tmp_path, suite, recipe, deps, "0.1.0", "0.7.0", wheels=wheels)
    assert code == 0 and record["first_changed"]["version"] == "0.6.0"
    by = {t["version"]: t for t in record["tested"]}
    assert by["0.4.0"]["outcome"] == "install failed" and "quantmatrix-no-such-package" in by["0.4.0"]["message"]
    assert by["0.3.0"]["outcome"] == "error" and "MoE oracle crashed" in by["0.3.0"]["message"]
    assert {by["0.4.0"]["verdict"], by["0.3.0"]["verdict"]} == {"skip"} and "skipped: no verdict" in out
    assert not list((tmp_path / "venvs").glob(".partial-*"))


def test_only_untestable_releases_between_gives_a_range_and_exit_1(tmp_path, suite, recipe, deps):
    wheels = releases(tmp_path / "wheels", {"0.1.0": "weight_only", "0.2.0": "error", "0.3.0": "uninstallable",
                                            "0.4.0": "w4a4"})
    record, code, out = bisect(tmp_path, suite, recipe, deps, "0.1.0", "0.4.0", wheels=wheels)
    assert code == 1 and record["status"] == "ambiguous" and record["untestable"] == ["0.2.0", "0.3.0"]
    assert "is one of 0.2.0, 0.3.0, 0.4.0" in out


def test_adjacent_releases_and_wrong_ends(tmp_path, suite, recipe, deps):
    wheels = releases(tmp_path / "wheels", {"0.1.0": "weight_only", "0.2.0": "w4a4", "0.3.0": "w4a4"})
    record, code, _ = bisect(tmp_path, suite, recipe, deps, "0.1.0", "0.2.0", wheels=wheels)
    assert code == 0 and record["candidates"] == ["0.1.0", "0.2.0"] and record["first_changed"]["version"] == "0.2.0"
    record, code, out = bisect(tmp_path, suite, recipe, deps, "0.2.0", "0.3.0", wheels=wheels)
    assert code == 1 and record["status"] == "endpoints" and "0.2.0 was stated good but is bad" in out
    with pytest.raises(BisectError, match="no installable 0.9.0"):
        bisect(tmp_path, suite, recipe, deps, "0.1.0", "0.9.0", wheels=wheels)
    with pytest.raises(BisectError, match="same release"):
        bisect(tmp_path, suite, recipe, deps, "0.1.0", "0.1.0", wheels=wheels)


def test_commits_narrow_a_release_pair_to_a_per_commit_build(tmp_path, suite, recipe, deps):
    wheels = releases(tmp_path / "wheels", {"0.1.0": "weight_only", "0.2.0": "w4a4", "0.3.0": "w4a4"})
    shas = ["a1b2c3d", "b2c3d4e", "c3d4e5f", "d4e5f60"]
    nightly = releases(tmp_path / "nightly", {f"0.2.0.dev{i}+g{s}": ("w4a4" if i >= 2 else "weight_only")
                                              for i, s in enumerate(shas)})
    index = simple_index(tmp_path / "nightly-simple", nightly)
    record, code, out = bisect(tmp_path, suite, recipe, deps, "0.1.0", "0.3.0", wheels=wheels,
                               commit_index=index + "/{package}/")  # a template, as the option allows
    c = record["commits"]
    assert code == 0 and c["status"] == "found" and c["first_commit"] == "c3d4e5f"
    assert c["last_unchanged"]["version"] == "0.2.0.dev1+gb2c3d4e" and "(commit c3d4e5f)" in out


def test_an_interrupted_install_is_not_cached_and_a_killed_one_is_cleaned(tmp_path, recipe, deps, monkeypatch):
    wheels = releases(tmp_path / "wheels", {"0.1.0": "weight_only"})
    sources = Sources(find_links=(str(deps), str(wheels)), no_index=True, offline=True)
    cache = VenvCache(tmp_path / "venvs")
    real = cache._uv

    def ctrl_c_in_install(args, log):
        if args[:2] == ["pip", "install"]:
            raise KeyboardInterrupt
        real(args, log)

    monkeypatch.setattr(cache, "_uv", ctrl_c_in_install)
    with pytest.raises(KeyboardInterrupt):
        cache.get("vllm", "0.1.0", recipe, sources, tmp_path / "log")
    assert cache.cached("vllm", "0.1.0") is None and list(cache.root.iterdir()) == []
    dead = cache.root / ".partial-999999999-vllm-0.1.0-x"  # a build whose process was SIGKILLed
    (dead / "venv").mkdir(parents=True)
    monkeypatch.setattr(cache, "_uv", real)
    venv, built = cache.get("vllm", "0.1.0", recipe, sources, tmp_path / "log")
    assert built and cache.cached("vllm", "0.1.0") == venv and not dead.exists()
    assert (venv / "bin" / "python").exists() and cache.get("vllm", "0.1.0", recipe, sources,
                                                           tmp_path / "log")[1] is False


def test_the_size_cap_evicts_least_recently_used_never_in_use(tmp_path, recipe, deps):
    wheels = releases(tmp_path / "wheels", {"0.1.0": "weight_only", "0.2.0": "w4a4"})
    sources = Sources(find_links=(str(deps), str(wheels)), no_index=True, offline=True)
    first = VenvCache(tmp_path / "venvs", cap_gb=1e-9)
    a, _ = first.get("vllm", "0.1.0", recipe, sources, tmp_path / "log")
    assert a.exists()  # over the cap, but in use by this run
    second = VenvCache(tmp_path / "venvs", cap_gb=1e-9)
    b, _ = second.get("vllm", "0.2.0", recipe, sources, tmp_path / "log")
    assert b.exists() and not a.exists()


def test_candidates_from_pep_691_json_and_tags(tmp_path):
    page = {"meta": {"api-version": "1.0"}, "files": [
        {"filename": "vllm-0.28.0-py3-none-any.whl"},
        {"filename": "vllm-0.29.0-py3-none-any.whl", "yanked": True},
        {"filename": "vllm-0.30.0-py3-none-any.whl"}, {"filename": "vllm-0.30.0.tar.gz"},
        {"filename": "vllm-0.31.0rc1-py3-none-any.whl"}, {"filename": "vllm-0.32.0-cp311-cp311-win_amd64.whl"}]}
    files = cand._parse(json.dumps(page).encode(), cand._JSON)
    found = cand.versions(files, "vllm")
    assert Version("0.29.0") not in found and Version("0.32.0") not in found and Version("0.30.0") in found
    assert cand.between(found, Version("0.30.0"), Version("0.28.0")) == [Version("0.28.0"), Version("0.30.0")]
    assert cand.between(found, Version("0.28.0"), Version("0.31.0rc1"))[-1] == Version("0.31.0rc1")
    assert cand.commit_of(Version("0.29.0.dev45+g1a2b3c4")) == "1a2b3c4"


def test_cli_usage_errors_exit_2(capsys):
    assert main(["bisect", "suites/test_dispatch.py::test_config_dispatch[x]", "--good", "0.28.0"]) == 2
    assert "give --good and --bad" in capsys.readouterr().err
    assert main(["bisect", "not-a-case-id", "--good", "0.28.0", "--bad", "0.29.0", "--commits"]) == 2
    assert main(["bisect", "x::y", "--good", "nope", "--bad", "0.29.0"]) == 2


def test_from_report_takes_the_range_a_real_report_names(junit_suite, tmp_path, capsys):
    """Night 1 passes on 0.11.1, night 2 fails on 0.11.2.dev5: the report's bisect range is the bisect's."""
    from test_report_diff import KEY_A, Nights, fail

    nights = Nights(junit_suite, tmp_path)
    cell = KEY_A.split("[")[1][:-1]
    nights.run({"cells": [cell], "vllm": "0.11.1"})
    nights.run({"cells": [cell], "outcomes": fail(cell), "vllm": "0.11.2.dev5"})
    summary = nights.previous
    r = range_from_report(summary, KEY_A)
    assert (str(r.good), str(r.bad)) == ("0.11.1", "0.11.2.dev5")
    nights.run({"cells": [cell], "outcomes": fail(cell), "vllm": "0.11.2.dev5"})
    with pytest.raises(BisectError, match="no bisect range .*'failed', not a new failure"):
        range_from_report(nights.previous, KEY_A)  # still failing: the range was last night's
    with pytest.raises(BisectError, match="no case"):
        range_from_report(summary, "test_suite::test_config_dispatch[nope]")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["bisect", KEY_A, "--from-report", str(nights.previous), "--wheels", str(empty)]) == 2
    assert "has no bisect range" in capsys.readouterr().err
    assert main(["bisect", KEY_A, "--from-report", str(summary), "--wheels", str(empty)]) == 2
    said = capsys.readouterr()
    assert "names the range: last passed on 0.11.1, failed on 0.11.2.dev5" in said.out
    assert "not a case in" in said.err  # the report's fake suite is no case of this checkout


def test_a_case_failed_by_the_vllm_health_gate_gives_no_verdict(pytester):
    """The health gate fails every case when the vLLM under test does not import: that release is skipped."""
    pytester.makepyfile(test_gate=f'''
        def test_case(record_property):
            record_property("{P.NOT_TESTED}", "{P.VLLM_BROKEN}")
            raise AssertionError("vLLM under test broken: import vllm.config failed")

        def test_green(record_property):
            record_property("{P.RESOLVED_SCHEME}", "weight_only")
    ''')
    pytester.runpytest("-p", "no:quantmatrix", "-p", "no:quantmatrix_e2e", "--junitxml=j.xml")
    got = read_junit(pytester.path / "j.xml", "test_gate.py::test_case")
    assert (got.verdict, got.outcome) == ("skip", "vllm broken") and "vllm.config" in got.message
    green = read_junit(pytester.path / "j.xml", "test_gate.py::test_green")
    assert green.verdict == "good" and green.describe() == f"passed: {P.RESOLVED_SCHEME}=weight_only"
    assert read_junit(pytester.path / "j.xml", "test_gate.py::test_gone").outcome == "not run"


def test_the_cli_runs_the_real_case_and_a_fake_vllm_is_no_verdict(tmp_path, deps, monkeypatch, capsys):
    """The real defaults: this checkout's suites, the real case id, the plugin's vLLM health gate. A fake vLLM
    has no `vllm.config`, so the gate fails the case: both ends give no verdict and the bisect says so."""
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path / "cache"))
    wheels = releases(tmp_path / "wheels", {"0.1.0": "weight_only", "0.2.0": "w4a4"})
    case = "suites/test_dispatch.py::test_config_dispatch[qwen3moe-tiny-nvfp4-weight-only@sm121-default]"
    record = tmp_path / "r.json"
    code = main(["bisect", case, "--good", "0.1.0", "--bad", "0.2.0", "--package", "vllm", "--wheels",
                 str(wheels), "--find-links", str(deps), "--offline", "--record", str(record)])
    out = capsys.readouterr().out
    assert code == 1 and "0.2.0 was stated bad but gives no verdict (vllm broken" in out
    data = json.loads(record.read_text())
    assert data["installs"] == 1 and data["tested"][0]["outcome"] == "vllm broken"
    assert [p.name[:10] for p in (tmp_path / "cache" / "bisect" / "venvs").iterdir()] == ["vllm-0.2.0"]
