"""`quantmatrix bisect CASE_ID --good V1 --bad V2`: name the release where one case's verdict changed.

Exit status: 0 the release (and, with --commits, the per-commit build) was named; 1 it could not be: an end of
the range did not show its stated verdict, or only releases that gave no verdict (install failed, case errored)
lie between the last unchanged and the first changed one; 2 bad input (an unknown release, case, index or
report); 3 an internal error; 130 interrupted (Ctrl-C), with no half-made venv kept.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from quantmatrix.adapter.versions import CPU_BUILD, CUDA_BUILD, build_for
from quantmatrix.bisect.session import Bisect, Plan, default_recipe
from quantmatrix.bisect.summary import range_from_report
from quantmatrix.bisect.venvs import CAP_ENV, DEFAULT_CAP_GB, Sources, VenvCache
from quantmatrix.cli.root import project_root
from quantmatrix.errors import BisectError
from quantmatrix.host.detect import query_nvidia_smi


def register(sub: Any) -> None:
    p = sub.add_parser("bisect", help="find the vLLM release where one case's verdict changed",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("case", metavar="CASE_ID", help="e.g. 'suites/test_dispatch.py::test_config_dispatch[CELL]' "
                   "(`quantmatrix list` names the cells; the report's key spelling works too)")
    p.add_argument("--good", type=_version, help="a release where the case passes")
    p.add_argument("--bad", type=_version, help="a release where it fails (older or newer than --good)")
    p.add_argument("--from-report", type=Path, metavar="SUMMARY", help="take --good/--bad from summary.json's "
                   "bisect range (last passing vLLM, tonight's vLLM)")
    p.add_argument("--package", help=f"the distribution to bisect (default: {CUDA_BUILD} on a host with an NVIDIA "
                   f"GPU, {CPU_BUILD} elsewhere)")
    p.add_argument("--index-url", help="PEP 503/691 simple index (default: UV_INDEX_URL, PIP_INDEX_URL, else PyPI)")
    p.add_argument("--extra-index-url", action="append", default=[], metavar="URL", help="another index for "
                   "dependencies (e.g. a torch CPU index); repeatable")
    p.add_argument("--find-links", action="append", default=None, metavar="DIR_OR_URL", help="extra wheel "
                   "locations for dependencies; repeatable (default: UV_FIND_LINKS or PIP_FIND_LINKS)")
    p.add_argument("--wheels", type=Path, metavar="DIR", help="air-gapped: list releases from DIR's wheels and "
                   "install only from DIR (no index)")
    p.add_argument("--offline", action="store_true", help="uv may use only its cache and local wheels")
    p.add_argument("--commits", action="store_true", help="then narrow the release pair to per-commit builds")
    p.add_argument("--commit-index", metavar="URL", help="index holding per-commit builds (versions with "
                   "+g<sha>); `{package}` in it is replaced, else PEP 503's URL/<package>/")
    p.add_argument("--record", type=Path, help="JSON record (default: reports/bisect/<time>.json in the checkout)")
    p.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="per case run (default 1800)")
    p.add_argument("--cache-cap", type=float, metavar="GB", help=f"venv cache size cap (default: {CAP_ENV}, "
                   f"else {DEFAULT_CAP_GB:g})")
    p.set_defaults(run=run)


def _version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise argparse.ArgumentTypeError(f"not a version: {text!r}") from None


def _env_list(*names: str) -> list[str]:
    return next((os.environ[n].split() for n in names if os.environ.get(n)), [])


def _range(args: argparse.Namespace) -> tuple[Version, Version, str | None]:
    if args.from_report is None:
        if args.good is None or args.bad is None:
            raise BisectError("give --good and --bad, or --from-report SUMMARY")
        return args.good, args.bad, None
    r = range_from_report(args.from_report, args.case)
    print(f"quantmatrix bisect: {args.from_report} names the range: last passed on {r.good}, failed on {r.bad}",
          flush=True)
    return args.good or r.good, args.bad or r.bad, r.package


def run(args: argparse.Namespace) -> int:
    good, bad, reported = _range(args)
    package = args.package or build_for(bool(query_nvidia_smi()))
    if reported and reported != package:
        print(f"quantmatrix bisect: the report's night ran {reported}; bisecting {package} (--package to change)",
              file=sys.stderr)
    if args.commits and not args.commit_index:
        raise BisectError("--commits needs --commit-index URL (an index of per-commit builds)")
    root = project_root()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    record = args.record or root / "reports" / "bisect" / f"{stamp}.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    wheels = args.wheels.resolve() if args.wheels else None
    links = args.find_links if args.find_links is not None else _env_list("UV_FIND_LINKS", "PIP_FIND_LINKS")
    sources = Sources(index_url=args.index_url or (_env_list("UV_INDEX_URL", "PIP_INDEX_URL") or [None])[0],
                      extra_index_urls=tuple(args.extra_index_url),
                      find_links=tuple(links) + ((str(wheels),) if wheels else ()), no_index=wheels is not None,
                      offline=args.offline)
    with tempfile.TemporaryDirectory(prefix="quantmatrix-bisect-") as work:
        plan = Plan(args.case, package, good, bad, root, sources, default_recipe(package, Path(work)), record,
                    record.with_suffix(".log"), wheels, args.commit_index if args.commits else None, args.timeout)
        try:
            _, code = Bisect(plan, VenvCache(cap_gb=args.cache_cap)).run()
        except KeyboardInterrupt:  # the venv being built was removed on the way out; finished ones stay cached
            print("quantmatrix bisect: interrupted; no half-made venv was kept, no record written", file=sys.stderr)
            return 130
    print(f"quantmatrix bisect: record {record}")
    return code
