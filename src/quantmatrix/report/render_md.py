"""matrix.md: the nightly grid and diff as Markdown, small enough for $GITHUB_STEP_SUMMARY (1 MiB cap)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TypeVar

from quantmatrix import properties as P
from quantmatrix.report import links
from quantmatrix.report.crossarch import describe_disagreement
from quantmatrix.report.model import DISAGREE, LOST, CaseResult, Grid, NightReport, cell_status

T = TypeVar("T")
LIST_LIMIT = 50  # entries per section: the rest is in index.html and summary.json
EMOJI = {"fail": "❌", "lost": "🕳️", "waived": "🟡", "pass": "✅", "skip": "⚪"}
_COUNTS = (("fail", ("failed", "error")), ("missing", ("missing",)), ("skip", ("skipped",)),
           ("waived", ("waived",)), ("xpass", ("xpassed",)), ("pass", ("passed",)))
_SPECIAL = re.compile(r"([\\`*_\[\]<>|#])")


def _text(s: str, limit: int = 200) -> str:
    """One line of untrusted text that cannot break the table or the page's Markdown."""
    s = " ".join(s.split())
    s = s if len(s) <= limit else s[: limit - 1] + "…"
    return _SPECIAL.sub(r"\\\1", s)


def _code(s: str, limit: int = 300) -> str:
    """A code span of untrusted text: one line (a newline would end the span and let the rest render as
    Markdown or HTML), no backticks, bounded."""
    s = " ".join(s.split()).replace("`", "'")
    return "`" + (s if len(s) <= limit else s[: limit - 1] + "…") + "`"


# A link target that can neither close the link nor carry markup: a plain http(s) URL.
_URL = re.compile(r"https?://[A-Za-z0-9._~:/?#@!$&'*+,;=%-]{1,500}")
MD_LIMIT = 1_000_000  # bytes: GitHub's step summary takes 1 MiB


def bounded(text: str, limit: int = MD_LIMIT) -> str:
    """The Markdown cut at a line boundary to fit `limit` bytes, saying where the rest is."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    note = "\n\n> ✂️ **matrix.md truncated to fit the step summary: the whole report is index.html and summary.json**\n"
    cut = data[: limit - len(note.encode("utf-8"))].decode("utf-8", "ignore")
    return cut[: cut.rfind("\n") + 1] + note


def cell_text(cases: list[CaseResult]) -> str:
    """'❌ 1 fail · 4 pass · 1 new': the status, then every non-zero count."""
    n = Counter(c.outcome for c in cases)
    parts = [f"{sum(n[o] for o in outs)} {label}" for label, outs in _COUNTS if any(n[o] for o in outs)]
    tags = Counter(t for c in cases if c.tags for t in c.tags)
    if tags["new_failure"]:
        parts.append(f"{tags['new_failure']} new")
    if tags[DISAGREE]:
        parts.append("≠ archs")
    return f"{EMOJI[cell_status(cases)]} " + " · ".join(parts)


def _first_line(s: str) -> str:
    return s.strip().splitlines()[0] if s.strip() else ""


def _section(title: str, items: Sequence[T], line: Callable[[T], str]) -> list[str]:
    """A heading and at most LIST_LIMIT lines; only those are formatted."""
    if not items:
        return []
    out = ["", f"## {title} ({len(items)})", ""]
    out += [f"- {line(item)}" for item in items[:LIST_LIMIT]]
    if len(items) > LIST_LIMIT:
        out.append(f"- … and {len(items) - LIST_LIMIT} more: see index.html / summary.json")
    return out


def _case_line(report: NightReport, c: CaseResult) -> str:
    line = f"{_code(c.key)} **{c.outcome}**"
    if c.message:
        line += f": {_text(_first_line(c.message))}"
    b = report.diff["bisect"].get(c.key)
    if b is not None:
        now = report.vllm_version(c) or "?"
        if b["last_passed_night"]:
            night, then = _text(b["last_passed_night"]), _text(b["last_passed_vllm"] or "?")
            line += f" — last passed **{night}** (vLLM {then}) → now vLLM {_text(now)}"
        else:
            line += f" — no pass in the last {report.history_nights} nights kept (now vLLM {_text(now)})"
    if c.tags & LOST and c.outcome != "missing":
        line += (" — newly skipped (coverage lost)" if "newly_skipped" in c.tags else
                 f" — still skipped, tested last on {_text(c.tested)} (coverage lost)")
    if "flaky" in c.tags:
        line += " — flaky" + (f" (attempts: {' → '.join(c.attempts)})" if c.attempts else "")
    offered = links.offers(report, c)
    if "bundle" in offered:
        line += f" — [repro bundle]({offered['bundle']}/)"
    for what in ("rerun", "bisect"):
        if what in offered:
            line += f"\n  - {what}: {_code(offered[what], 1500)}"
    return line


def render(report: NightReport, g: Grid) -> str:
    d = report.diff
    totals = report.totals()
    lost = report.lost()
    head = [f"# quantmatrix nightly — {_text(report.night)}", ""]
    vs = f"vs {_text(report.previous_night)}" if report.previous_night else "no previous night to compare"
    head.append(f"{vs} · {len(report.inputs)} JUnit files · {len(report.cases)} cases · " +
                " · ".join(f"{n} {o}" for o, n in totals.items() if n))
    head.append("")
    verdict = report.headline()
    # the headline names the night's own problems (a broken vLLM, an arch job that could not test) once each
    head.append(f"> **{_text(verdict, 4000)}**" if report.exit_code else f"> {verdict}")
    if d["archs_lost"]:
        head.append(f"> 🕳️ **no results at all from: {', '.join(_text(a) for a in d['archs_lost'])}**")
    reported = report.reported()
    head.append(f"> reported: {_text('; '.join(reported[:LIST_LIMIT]), 4000) if reported else 'no runner'}"
                + (f" · report {report.updates} of this night (updated as late runners arrived)"
                   if report.updates > 1 else "")
                + (f" · nightly run {_text(report.conclusion)}" if report.conclusion else ""))

    heads = " | ".join(f"{_text(a)}<br>{_text(m)}" for a, m in g.cols)
    table = ["", "## Matrix", "", f"| checkpoint | scheme | {heads} |", "|---|---|" + "---|" * len(g.cols)]
    for row in g.rows:
        cells = [cell_text(g.cells[(row, a, m)]) if (row, a, m) in g.cells else "" for a, m in g.cols]
        table.append(f"| {_text(row)} | {_text(g.schemes.get(row, ''))} | " + " | ".join(cells) + " |")
    table.append("")
    table.append("❌ failed or error · 🕳️ coverage lost (newly skipped or missing) · 🟡 waived · ✅ passed · "
                 "⚪ skipped only · ≠ archs: greedy tokens differ across archs (❌ where a token at the first "
                 "divergence is outside the other arch's top-k)")

    def case(key: str) -> str:
        return _case_line(report, report.cases[key])

    body = _section("New failures", d["new_failures"], case) + _section("Coverage lost", lost, case)
    body += _section("Still failing", d["still_failing"], case) + _section("Fixed", d["fixed"], _code)
    body += _section("Flaky", d["flaky"], case)
    body += _section("Cross-arch disagreements", report.disagreements,
                     lambda x: ("❌ " if x["red"] else "≈ ") + _text(describe_disagreement(x), 400))
    uninit = [c for c in report.cases.values() if c.prop(P.UNINIT_OTHER_READS) is not None]
    body += _section("Uninitialised reads (sanitize mode)", uninit, _uninit_line)
    # a case under a waiver never reads as a plain pass (it is waived, xpassed or failed): skip those fast
    waived = [c for c in report.cases.values() if c.outcome != "passed" and c.prop(P.WAIVER_REASON) is not None]
    body += _section("Waivers", waived, _waiver_line)
    unreviewed = [c for c in report.cases.values() if c.prop(P.UNREVIEWED_REFERENCE) is not None]
    body += _section("Compared with unreviewed references (docs/runners.md: First GPU references)", unreviewed,
                     lambda c: f"{_code(c.key)} {c.outcome}: {_code(c.prop(P.UNREVIEWED_REFERENCE) or '')}")
    body += _section("Removed from the matrix (no longer reported)", d["removed"], _code)
    body += _section("Bad input files (skipped)", report.bad_inputs,
                     lambda b: f"{_code(b['path'])}: {_text(b['problem'])}")
    runs = ["", "## Runs", "", "| file | runner | arch | device | vLLM | torch | started | cases |",
            "|---" * 8 + "|"]
    for inp in report.inputs[:LIST_LIMIT]:
        p = {**inp.common, **inp.properties}
        runs.append("| " + " | ".join(_text(x) for x in (
            inp.path, p.get(P.RUNNER, ""), ", ".join(inp.archs) or p.get(P.ARCH, ""), p.get(P.DEVICE_NAME, ""),
            p.get(P.VLLM_VERSION, ""), p.get(P.TORCH_VERSION, ""), inp.stamp)) + f" | {inp.cases} |")
    if len(report.inputs) > LIST_LIMIT:
        runs.append(f"| … and {len(report.inputs) - LIST_LIMIT} more files | | | | | | | |")
    return bounded("\n".join(head + table + body + runs) + "\n")


def _uninit_line(c: CaseResult) -> str:
    """A sanitized cell: the model's tensors read where nobody wrote (failed), silenced ones, and the count of
    other uninitialised reads (scratch/activation memory) per kernel."""
    found = P.decode_json(c.prop(P.UNINIT_PARAM_READS), list) or []
    silenced = P.decode_json(c.prop(P.UNINIT_SILENCED), list) or []
    other = P.decode_json(c.prop(P.UNINIT_OTHER_READS), dict) or {}
    names = ", ".join(_text(f"{f.get('tensor')} (experts {f.get('experts') or '-'}, reads: {f.get('reads')})", 120)
                      for f in found[:3] if isinstance(f, dict))
    line = f"{_code(c.key)} **{c.outcome}**: {len(found)} tensor(s) of the model read where nobody wrote"
    line += f": {names}" if names else ""
    if silenced:
        line += f"; {len(silenced)} silenced"
    reads = sum(n for n in other.values() if type(n) is int)
    top = ", ".join(f"{_code(str(k), 60)} ×{n}" for k, n in list(other.items())[:3])
    return line + f"; {reads} other reads (scratch/activation) in {len(other)} kernel(s)" + (f": {top}" if top else "")


def _waiver_line(c: CaseResult) -> str:
    p = c.props
    link = p.get(P.WAIVER_LINK, "")
    shown = f"[{_text(link)}]({link})" if _URL.fullmatch(link) else _text(link)
    expired = p.get(P.WAIVER_EXPIRED) == "true" or c.message.startswith("waiver expired")
    state = "**expired**, counted as failed" if expired else c.outcome
    return (f"{_code(c.key)} {state}: {_text(p[P.WAIVER_REASON])} ({shown}; expires "
            f"{_text(p.get(P.WAIVER_EXPIRES, '?'))})")
