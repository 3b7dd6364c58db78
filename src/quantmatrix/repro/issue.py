"""ISSUE.md: the bundle as an issue body for vLLM's tracker, in Markdown: what failed, what was expected and
observed, the exact vLLM and its install line, how to run the script, and what the bundle holds."""

from __future__ import annotations

import json
from typing import Any

_FENCE = "````"  # longer than any ``` inside a failure message or log


def _fenced(text: str, lang: str = "") -> str:
    return f"{_FENCE}{lang}\n{text.rstrip()}\n{_FENCE}"


def body(case: dict[str, Any]) -> str:
    v, ck = case["vllm"], case["checkpoint"]
    where = (f"`{ck['id']}` ({ck['producer']}, {ck['scheme']}; {ck['label']})" if ck.get("label")
             else f"`{ck['id']}` ({ck['producer']}, {ck['scheme']})")
    source = {"synthetic": "synthetic (quantmatrix's factory; spec in case.json)",
              "hub": f"`{ck.get('repo')}` at commit `{ck.get('commit')}`",
              "path": f"a local folder on the runner: `{ck.get('path')}`"}[ck["source"]]
    engine = case.get("engine_files")
    lines = [
        f"## {case['check']} fails for {case['cell']} on vLLM {v['vllm_version']}", "",
        f"**Check** `{case['check']}` ({case['kind']}): {case['title']}.  ",
        f"**Cell** `{case['cell']}`: checkpoint {where}, arch {case['arch']['describe']}, mode "
        f"`{case['mode']['name']}`.  ",
        f"**Checkpoint** {source}{' - its files are in the bundle' if ck.get('files') else ''}.  ",
        f"**vLLM under test** `{v['vllm_distribution']} {v['vllm_version']}`, commit `{v['vllm_commit']}`, wheel "
        f"`{v['vllm_wheel']}` (torch {v['torch_version']}, {v['platform']}).", "",
        "### What the check saw", "", _fenced(case["message"]), "",
        "### Expected (the matrix) and observed (the failing run)", "",
        _fenced(json.dumps({"expected": _brief(case["expected"]), "observed": case["recorded"]}, indent=1,
                           sort_keys=True), "json"), "",
        "### Reproduce without quantmatrix", "",
        "`repro.py` imports only vLLM and its dependencies. It exits 1 while the bug is there, 0 once it is "
        "fixed, 2 where this host cannot show it, so it can become the fix's regression test.", "",
        _fenced(f"{v['install']}\nrepro-venv/bin/python repro.py", "sh"), "",
        "### Environment", "",
        _environment(case.get("environment")),
    ]
    if engine:
        lines += ["", "### Engine run", "", "engine/ holds the failing run's engine log, request and result: "
                  + ", ".join(f"{k} ({w})" for k, w in engine.items()) + "."]
    if case.get("log_tail"):
        lines += ["", "<details><summary>log tail of the failing case</summary>", "", _fenced(case["log_tail"]), "",
                  "</details>"]
    lines += ["", f"<sub>made by quantmatrix {case['made_by']['quantmatrix']} from {case['made_by']['from']} at "
                  f"{case['made_by']['at']}; case `{case['nodeid']}`</sub>", ""]
    return "\n".join(lines)


def _environment(state: str | None) -> str:
    if state is None:
        return "Not collected (the bundle was made with --no-environment)."
    said = "" if state == "collected" else f" It did not finish: {state}."
    return f"`environment.txt` is what `vllm collect-env` printed on the host that made this bundle.{said}"


def _brief(expected: dict[str, Any]) -> dict[str, Any]:
    """The expectations a reader needs in the issue: long reference data stays in case.json."""
    long = ("backends", "reference", "base_outputs", "tasks", "in_memory", "prompt_ids", "prompts")
    return {k: (f"(in case.json: {len(v)} entries)" if k in long and isinstance(v, (list, dict)) else v)
            for k, v in expected.items()}
