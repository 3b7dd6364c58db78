"""A mode's `sanitizer:` knob (docs/e2e.md#sanitize-mode): its engine child runs under NVIDIA compute-sanitizer.

Named knobs, never free text that reaches a shell or the environment: the tool, the extra flags (from an
allow-list: a flag that loads code, filters reports without a reason or changes the exit status is refused), how
little the sanitized run generates, and which kernels the project silences, each with a reason and a link. The
executable is the runner's (host.sanitizer finds it; a runner names it with --compute-sanitizer), never the
matrix's."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from quantmatrix.schema.yamldoc import Doc, Field, as_text, closest, int_at_least, list_of, one_of, positive

TOOLS = ("initcheck",)  # the tools whose report measure.initcheck reads
# Flags a mode may pass through (each takes one value). The runner sets --tool and --log-file itself; --xml and
# --save change the report's form; --exclude / --filter would hide kernels without the reason a silence entry
# states; --injection-path loads a library; --error-exitcode turns the counted noise into a failed child.
FLAGS = ("--print-limit", "--target-processes", "--show-backtrace", "--check-api-memory-access",
         "--track-unused-memory", "--launch-timeout", "--check-exit-code")


@dataclasses.dataclass(frozen=True)
class Silence:
    """Reads the project decided not to fail on: a kernel (glob over its demangled name) reading a tensor (glob
    over the parameter or buffer name, `*` for any), with why and where that was decided."""

    kernel: str
    tensor: str
    reason: str
    link: str
    where: str

    def matches(self, kernel: str, tensor: str) -> bool:
        return fnmatch.fnmatchcase(kernel, self.kernel) and fnmatch.fnmatchcase(tensor, self.tensor)


@dataclasses.dataclass(frozen=True)
class Sanitizer:
    """How a mode's engine runs sanitized: `prompts` of the e2e prompts, `max_tokens` each (the load, one forward
    and a token or two read every weight and scale; a longer run only adds activation noise)."""

    tool: str
    flags: tuple[str, ...]
    prompts: int
    max_tokens: int
    timeout_s: float | None
    silence: tuple[Silence, ...]

    def silenced(self, kernel: str, tensor: str) -> Silence | None:
        return next((s for s in self.silence if s.matches(kernel, tensor)), None)


def _flags(doc: Doc, node: yaml.Node, what: str) -> tuple[str, ...]:
    items = list_of(as_text)(doc, node, what)
    nodes = doc.sequence(node, what)
    expect_value = False
    for i, (item, n) in enumerate(zip(items, nodes, strict=True)):
        if expect_value:
            if item.startswith("-"):
                raise doc.error(n, f"{what}[{i}]: {items[i - 1]} needs a value, got the flag {item!r}")
            expect_value = False
            continue
        flag = item.partition("=")[0]
        if flag not in FLAGS:
            raise doc.error(n, f"{what}[{i}]: {item!r} is not a flag a mode may pass{closest(flag, FLAGS)}; "
                               f"allowed: {', '.join(FLAGS)} (the runner sets --tool and --log-file)")
        expect_value = "=" not in item
    if expect_value:
        raise doc.error(nodes[-1], f"{what}: {items[-1]} needs a value")
    return items


def _silence(doc: Doc, node: yaml.Node, what: str) -> Silence:
    r = doc.record(node, what, {
        "kernel": Field(as_text, "glob over the kernel's demangled name, e.g. '*GroupProblemShape*'"),
        "tensor": Field(as_text, "glob over the parameter or buffer name ('*': any)", required=False, default="*"),
        "reason": Field(as_text, "why these reads are not a bug"),
        "link": Field(as_text, "issue or PR that decided it"),
    })
    return Silence(r["kernel"], r["tensor"], r["reason"], r["link"], doc.where(node))


def parse(doc: Doc, node: yaml.Node, what: str) -> Sanitizer:
    r = doc.record(node, what, {
        "tool": Field(one_of(TOOLS), "compute-sanitizer tool"),
        "flags": Field(_flags, "extra compute-sanitizer flags, each with its value", required=False, default=tuple),
        "prompts": Field(int_at_least(1), "how many of the e2e prompts the sanitized run generates for"),
        "max_tokens": Field(int_at_least(1), "tokens generated per prompt under the sanitizer"),
        "timeout_s": Field(positive, "wall-clock limit of the sanitized engine run (default e2e.timeout_s)",
                           required=False),
        "silence": Field(list_of(_silence), "kernels whose reads of the model's memory do not fail the cell, each "
                         "with reason and link", required=False, default=tuple),
    })
    return Sanitizer(r["tool"], r["flags"], r["prompts"], r["max_tokens"], r["timeout_s"], r["silence"])


def check_prompts(doc: Doc, nodes: Sequence[yaml.Node], modes: Sequence[Any], prompts: int, prompts_file: Path) -> None:
    """A sanitized run generates for the first `prompts` e2e prompts: asking for more than there are is an error
    at the mode's line, not a silent cut. `modes`: the matrix's Modes, in the order of their `nodes`."""
    for node, mode in zip(nodes, modes, strict=True):
        if mode.sanitizer is not None and mode.sanitizer.prompts > prompts:
            raise doc.error(node, f"mode {mode.name!r}: sanitizer.prompts {mode.sanitizer.prompts} exceeds the "
                                  f"{prompts} prompts of {prompts_file}")
