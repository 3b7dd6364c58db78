"""The standalone script of a bundle: a header that says what it shows and how to run it, the case's data, the
check's observer and `run` lifted out of quantmatrix with everything they need (repro.lift), and a main guard
(vLLM's engine spawns processes that import the script again). It must import no quantmatrix: checked here on
the written text, and by the tests, which run it where quantmatrix cannot be imported."""

from __future__ import annotations

import ast
import pprint
import textwrap
from collections.abc import Callable
from typing import Any

from quantmatrix.checkpoints import producers
from quantmatrix.errors import ReproError
from quantmatrix.repro import observe, observe_e2e
from quantmatrix.repro.lift import Lifter
from quantmatrix.schema.factory import PRODUCERS, SCHEMES

OBSERVERS: dict[str, Callable[..., Any]] = {
    "config_dispatch": observe.observe_config_dispatch,
    "layer_dispatch": observe.observe_layer_dispatch,
    "post_load_audit": observe.observe_post_load_audit,
    "kernel_format": observe.observe_kernel_format,
    "observed_reads": observe.observe_observed_reads,
    "checkpoint_lint": observe.observe_checkpoint_lint,
    "hf_reference": observe.observe_hf_reference,
    "dequant_logits": observe.observe_dequant_logits,
    "device_identity": observe.observe_device_identity,
    "degeneration": observe_e2e.observe_degeneration,
    "agreement": observe_e2e.observe_agreement,
    "mode_invariance": observe_e2e.observe_mode_invariance,
    "task_accuracy": observe_e2e.observe_task_accuracy,
}


def frozen() -> dict[Callable[..., Any], list[tuple[Any, ...]]]:
    """The producers' tensor-name tables, answered now for every producer and scheme module: the producer
    modules are imported by name (light imports for vLLM's plugin processes), which a script cannot do."""
    modules = sorted({s.module for s in SCHEMES.values()})
    pairs = [(p, m) for p in PRODUCERS for m in modules if m in producers.producer(p).LEAVES]
    return {producers.leaves: pairs, producers.shapes: pairs, producers.packing: pairs,
            producers.writers: [(m,) for m in modules], producers.quantized_leaves: [(m,) for m in modules],
            producers._roles: [()]}


def _doc(text: str) -> str:
    """Text that cannot end the docstring it goes into."""
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def _wrapped(text: str) -> str:
    return textwrap.fill(text, 116)


def header(case: dict[str, Any]) -> str:
    message = "\n".join(f"    {_doc(line)}" for line in case["message"].strip().splitlines()[:30])
    return f'''#!/usr/bin/env python3
"""{case["heading"]}: {_doc(case["title"])}

{message}

A standalone reproduction for vLLM developers: it imports vLLM and its dependencies only (never quantmatrix) and
observes the checkpoint in this folder exactly as quantmatrix's check did, judging it with the check's own code.
Exit status: 0 the check passes here (the bug is fixed), 1 it fails as above, 2 this host cannot show it.
Keep it as the fix's regression test.

The vLLM that failed: {case["vllm"]["vllm_distribution"]} {case["vllm"]["vllm_version"]} (commit \
{case["vllm"]["vllm_commit"]}; wheel {case["vllm"]["vllm_wheel"]})
Install it without quantmatrix:
    {case["vllm"]["install"]}
Run:
    repro-venv/bin/python repro.py [--checkpoint DIR] [--json]

{_wrapped(f"The code below CASE is quantmatrix's own ({', '.join(case['lifted_from'])}), copied by "
           "`quantmatrix repro` with everything it calls, so that no name of vLLM's is spelled twice and the "
           "verdict is the check's.")}
"""
'''


def write(case: dict[str, Any]) -> str:
    """The script's text for `case` (repro.bundle's case data); ReproError when the check has no observer or
    the lifted code would still need quantmatrix."""
    observer = OBSERVERS.get(case["check"])
    if observer is None:
        raise ReproError(f"check {case['check']!r} has no repro observer (known: {', '.join(OBSERVERS)})")
    lifter = Lifter(frozen())
    run, name = lifter.add(observe.run), lifter.add(observer)
    imports, body = lifter.script()
    case = {**case, "lifted_from": sorted({m.removeprefix("quantmatrix.") for m, _ in lifter.items
                                           if m.startswith("quantmatrix.")})}
    data = pprint.pformat({k: v for k, v in case.items() if k != "lifted_from"}, width=116, sort_dicts=False)
    needed = ["import sys", "from pathlib import Path"]
    text = "\n".join([
        header(case), "from __future__ import annotations", "",
        *sorted(set(needed) | {i for i in imports if not i.startswith("from __future__")}), "",
        f"CASE = {data}", "", "",
        "\n\n".join(body).rstrip(), "", "",
        'if __name__ == "__main__":',
        f"    sys.exit({run}(CASE, {name}, Path(__file__), sys.argv[1:]))", ""])
    _standalone(text)
    return text


def _standalone(text: str) -> None:
    """No import of quantmatrix anywhere in the script, and no module of it named as a string."""
    for node in ast.walk(ast.parse(text)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(
            node, ast.ImportFrom) else []
        if any(n.split(".")[0] == "quantmatrix" for n in names):
            raise ReproError(f"the lifted script still imports {names} (line {node.lineno})")
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__", "files") and any(
                isinstance(a, ast.Constant) and str(a.value).startswith("quantmatrix") for a in node.args):
            raise ReproError(f"the lifted script loads quantmatrix by name (line {node.lineno})")
