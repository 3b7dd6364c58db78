"""Resolve the vLLM under test once per night, for each CPU architecture of the GPU runners (nightly.yml's plan
job). Standard library only: it runs on a bare ubuntu-latest before anything is installed.

    python3 vllm_plan.py SPEC [--index URL]

SPEC is the nightly's `vllm` input:
  ""                 vLLM's nightly wheels: the newest commit that has a wheel for every CPU architecture
  keep               the vLLM each runner already has (its own environment, docs/runners.md)
  0.33.0             that release from PyPI (the same pin on every architecture)
  <40-hex commit>    that commit's wheels from the per-commit index
  URL or *.whl path  that wheel (one file: architectures it does not fit fail to install, loudly)

It prints GitHub step outputs (`key=value` lines): kind, commit (a hex prefix or full hash, empty when unknown),
version, and x86_64 / aarch64, the pip requirement each architecture installs (`keep` for keep). Exit 1, with
the reason on stderr, when a nightly or commit has no wheel for one of the architectures.
"""

from __future__ import annotations

import argparse
import html.parser
import re
import sys
import urllib.parse
import urllib.request

MACHINES = ("x86_64", "aarch64")
INDEX = "https://wheels.vllm.ai"
# vllm-<version>-<python tag>-<abi tag>-<platform tag>.whl; a nightly's version carries +g<commit>
WHEEL = re.compile(r"vllm-(?P<version>[^-]+)-[^-]+-[^-]+-(?P<platform>[^-]+)\.whl")
COMMIT_IN_VERSION = re.compile(r"\+(?:.*\.)?g(?P<commit>[0-9a-f]{7,40})\b")


class _Links(html.parser.HTMLParser):
    """The hrefs of a PEP 503 simple index page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def wheels(page_url: str) -> list[tuple[str, str, str]]:
    """(absolute URL, version, platform tag) of every vLLM wheel an index page links to."""
    fetch = page_url + "index.html" if page_url.startswith("file:") and page_url.endswith("/") else page_url
    with urllib.request.urlopen(fetch, timeout=60) as response:  # noqa: S310 - https, or file for a local mirror
        text = response.read().decode("utf-8")
    parser = _Links()
    parser.feed(text)
    out = []
    for href in parser.hrefs:
        url = urllib.parse.urljoin(page_url, href.split("#", 1)[0])
        found = WHEEL.fullmatch(urllib.parse.unquote(url.rsplit("/", 1)[-1]))
        if found:
            out.append((url, found["version"], found["platform"]))
    return out


def _natural(version: str) -> list[tuple[int, int | str]]:
    """dev10 after dev9: digits compare as numbers."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", version) if p]


def for_each_machine(found: list[tuple[str, str, str]], where: str) -> dict[str, str]:
    """One wheel per CPU architecture, all of one version (one commit): two archs never test different vLLMs."""
    versions = sorted({v for _, v, _ in found}, key=_natural, reverse=True)
    for version in versions:
        picks = {m: url for url, v, platform in found if v == version for m in MACHINES if platform.endswith(m)}
        if set(picks) == set(MACHINES):
            return {"version": version, **picks}
    have = "; ".join(f"{m}: {', '.join(v for _, v, p in found if p.endswith(m)) or 'none'}" for m in MACHINES)
    raise SystemExit(f"vllm_plan: {where} has no version with a wheel for every CPU architecture ({have})")


def plan(spec: str, index: str) -> dict[str, str]:
    spec = spec.strip()
    if spec == "keep":
        return {"kind": "keep", "commit": "", "version": "", **{m: "keep" for m in MACHINES}}
    if re.fullmatch(r"\d+\.\d+(\.\d+)?([a-z0-9.+-]*)", spec):
        return {"kind": "release", "commit": "", "version": spec, **{m: f"vllm=={spec}" for m in MACHINES}}
    if "://" in spec or spec.endswith(".whl"):
        found = WHEEL.fullmatch(spec.rsplit("/", 1)[-1])
        version = found["version"] if found else ""
        commit = COMMIT_IN_VERSION.search(version)
        return {"kind": "wheel", "commit": commit["commit"] if commit else "", "version": version,
                **{m: spec for m in MACHINES}}
    if spec and not re.fullmatch(r"[0-9a-f]{40}", spec):
        raise SystemExit(f"vllm_plan: {spec!r} is neither empty, keep, a version, a 40-hex commit nor a wheel")
    where = f"{index.rstrip('/')}/{spec or 'nightly'}/vllm/"
    picked = for_each_machine(wheels(where), where)
    commit = COMMIT_IN_VERSION.search(picked["version"])
    return {"kind": "commit" if spec else "nightly", "commit": spec or (commit["commit"] if commit else ""),
            **picked}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default="")
    parser.add_argument("--index", default=INDEX, help=f"vLLM wheel index (default {INDEX})")
    args = parser.parse_args(argv)
    for key, value in plan(args.spec, args.index).items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
