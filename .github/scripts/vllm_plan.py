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
version, x86_64 / aarch64, the pip requirement each architecture installs (`keep` for keep), and note. Where no
version has a wheel for every architecture (an index that mirrors only the latest commit, one build missing), the
plan falls back per architecture: the newest version is planned where it has a wheel, an architecture without one
gets an empty requirement, and `note` says so; that arch's job then reports "no wheel for this CPU architecture at
this commit" instead of the whole night failing. Exit 1, with the reason on stderr, for a spec that is none of
the above (a newline or a character outside a URL's is refused before anything is fetched) or an index with no
vLLM wheel at all.
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
    """One wheel per CPU architecture, all of one version (one commit): two archs never test different vLLMs. Where
    no version has every architecture, the newest version for those it has, the others empty and named."""
    versions = sorted({v for _, v, _ in found}, key=_natural, reverse=True)
    if not versions:
        raise SystemExit(f"vllm_plan: {where} lists no vLLM wheel")
    for version in versions:
        picks = {m: url for url, v, platform in found if v == version for m in MACHINES if platform.endswith(m)}
        if set(picks) == set(MACHINES):
            return {"version": version, **picks, "note": ""}
    version = versions[0]
    picks = {m: url for url, v, platform in found if v == version for m in MACHINES if platform.endswith(m)}
    have = "; ".join(f"{m}: {', '.join(v for _, v, p in found if p.endswith(m)) or 'none'}" for m in MACHINES)
    lacking = [m for m in MACHINES if m not in picks]
    note = (f"{where} has no version with a wheel for every CPU architecture ({have}): {version} planned for "
            f"{', '.join(picks)}; no wheel for {', '.join(lacking)} at this commit")
    return {"version": version, **{m: picks.get(m, "") for m in MACHINES}, "note": note}


# What a spec may hold at all: a URL's characters, no whitespace (a newline would write a line of its own into
# GITHUB_OUTPUT or GITHUB_ENV), no shell or expression syntax.
SAFE = re.compile(r"[A-Za-z0-9._~:/?#@%+=-]{0,500}")


def plan(spec: str, index: str) -> dict[str, str]:
    if not SAFE.fullmatch(spec):
        raise SystemExit(f"vllm_plan: the vLLM spec {spec[:100]!r} holds a character outside "
                         "[A-Za-z0-9._~:/?#@%+=-] or is longer than 500")
    if spec == "keep":
        return {"kind": "keep", "commit": "", "version": "", **{m: "keep" for m in MACHINES}, "note": ""}
    if re.fullmatch(r"\d+\.\d+(\.\d+)?([a-z0-9.+-]*)", spec):
        return {"kind": "release", "commit": "", "version": spec, **{m: f"vllm=={spec}" for m in MACHINES},
                "note": ""}
    if "://" in spec or spec.endswith(".whl"):
        found = WHEEL.fullmatch(spec.rsplit("/", 1)[-1])
        version = found["version"] if found else ""
        commit = COMMIT_IN_VERSION.search(version)
        return {"kind": "wheel", "commit": commit["commit"] if commit else "", "version": version,
                **{m: spec for m in MACHINES}, "note": ""}
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
    try:
        planned = plan(args.spec, args.index)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 1
    for key, value in planned.items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
