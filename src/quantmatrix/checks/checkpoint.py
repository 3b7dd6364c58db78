"""The checkpoint checks (suites/test_checkpoints.py): the lint's findings against `expect.lint`, the bf16
model's greedy output in transformers, the dequantized model's logits against bf16; each verdict shows the
numbers that decided."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from quantmatrix import properties as P
from quantmatrix.checkpoints import producers, store
from quantmatrix.checkpoints.lint import SCHEME, LintReport, declared
from quantmatrix.checks.expected import unmatched
from quantmatrix.checks.verdict import Verdict
from quantmatrix.schema.model import Case, TensorFinding
from quantmatrix.schema.synthetic import SyntheticSpec

# Quantizer sanity: the dequantized model's logits against the bf16 model's on the shipped prompts.
# Measured (factory v2, cpu_tiny): relative error 0.150 (Qwen3-MoE experts, both producers), 0.166 (Mixtral
# experts), 0.267 (Qwen3-MoE experts + attention); top-1 agreement 0.69-0.90. Swapping the nibble order of
# every packed weight gives 0.74 and top-1 0.25 (tests/test_factory.py keeps that control).
LOGIT_REL_ERROR_BOUND = 0.35
TOP1_AGREEMENT_BOUND = 0.6
# Producers whose stored global scale is the quantizing one: vLLM decodes with its inverse.
INVERTED_GLOBAL_SCALE = ("compressed-tensors",)


def lint_verdict(case: Case, report: LintReport) -> Verdict:
    """The lint's findings must be exactly the ones the matrix expects (none, for a sound export), per tensor
    where the matrix names the tensor."""
    return Verdict(lint_problem(case.cell.checkpoint.expectation("lint"), report), properties=[
        (P.LINT_DECLARED, f"{report.declared.producer} {report.declared.scheme}"),
        (P.LINT_FINDINGS, len(report.findings))])


def lint_problem(expected: tuple[str | TensorFinding, ...], report: LintReport) -> str | None:
    """Every expected code appears (a pinned one on each tensor its glob names: three planted `bad_value`s are
    three findings, not one code) and every finding is expected, by code or by code and tensor."""
    missing, unfound, extra = unmatched(expected, report.findings, lambda f: f.code, lambda f: (f.name,))
    parts = [f"expected findings {missing} did not appear"] if missing else []
    parts += [f"expected {e.code} on {e.tensor}: no such finding there" for e in unfound]
    if extra:
        parts.append(f"unexpected findings {sorted({f.code for f in extra})}" + "".join(
            f"\n  {f.code}: {f}" for f in extra))
    return f"lint: {'; '.join(parts)}\n{report.render()}" if parts else None


def hf_verdict(case: Case, greedy: tuple[list[list[int]], str | None]) -> Verdict:
    """The bf16 model loads in transformers from its own files and continues the prompts as its in-memory
    model does."""
    got, problem = greedy
    return Verdict(problem, properties=[(P.HF_GREEDY_TOKEN_IDS, got)])


def hf_reference(path: Path, spec: SyntheticSpec) -> tuple[list[list[int]], str | None]:
    """transformers' greedy output from the files on disk (from_pretrained and its checkpoint conversion), and how
    it differs (None: identical) from the same model built in memory from the factory's tensors and never saved:
    the write/load path must reproduce a forward it took no part in."""
    from quantmatrix.checkpoints import base

    made = store.contents(spec)
    prompts = base.prompts()
    ids = base.encode(path, prompts)
    if ids != base.encode(made.tokenizer, prompts):
        return [], "tokenizer.json on disk encodes the prompts differently from the tokenizer the factory trains"
    want = base.greedy(base.in_memory(spec.model, made.json_files["config.json"], made.tensors), ids)
    got = base.greedy(base.load_hf(path), ids)
    if got == want:
        return got, None
    rows = [f"  {p!r}: in memory {w}, from the files {g}" for p, w, g in zip(prompts, want, got, strict=True)
            if w != g]
    return got, ("greedy output of the model loaded from its files differs from the same weights' in-memory "
                 "model (never saved):\n" + "\n".join(rows))


@dataclasses.dataclass(frozen=True)
class LogitError:
    rel_error: float  # max over prompts of ||dq - bf16|| / ||bf16||
    top1: float  # mean over prompts of the fraction of positions with the same argmax

    def problem(self) -> str | None:
        if self.rel_error <= LOGIT_REL_ERROR_BOUND and self.top1 >= TOP1_AGREEMENT_BOUND:
            return None
        return (f"dequantized model strays from bf16: logit relative error {self.rel_error:.4f} (bound "
                f"{LOGIT_REL_ERROR_BOUND}), top-1 agreement {self.top1:.3f} (bound {TOP1_AGREEMENT_BOUND})")


def dequant_verdict(case: Case, err: LogitError) -> Verdict:
    """The NVFP4 export's dequantized model stays within the logit bounds of the bf16 model it came from."""
    problem = err.problem()
    return Verdict(f"{case.cell.id}: {problem}" if problem else None, properties=[
        (P.LOGIT_REL_ERROR, round(err.rel_error, 5)), (P.TOP1_AGREEMENT, round(err.top1, 4))])


def base_dir(checkpoint: Any) -> Path:
    """The bf16 family member a synthetic NVFP4 checkpoint was quantized from, from the cache."""
    return store.base_of(checkpoint)


def dequantized_state(checkpoint_dir: Path) -> dict[str, Any]:
    """The bf16 state dict the checkpoint's own files encode, every NVFP4 weight decoded by vLLM's dequantization
    (adapter.nvfp4), not by the factory's unpack; scales and activation scales dropped, other tensors as
    stored. A module whose scales do not fit its weight is a checkpoint that cannot be decoded (an error)."""
    import torch
    from safetensors.torch import load_file

    from quantmatrix.adapter import nvfp4 as vllm_nvfp4

    producer = declared(checkpoint_dir)[0].producer
    names = producers.leaves(producer, SCHEME)
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(checkpoint_dir.glob("*.safetensors")):
        tensors.update(load_file(file))
    state = {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        if leaf == names["weight"] and t.dtype == torch.uint8:
            global_scale, block_scale = f"{module}.{names['global_scale']}", f"{module}.{names['block_scale']}"
            missing = [n for n in (global_scale, block_scale) if n not in tensors]
            if missing:
                raise ValueError(f"{checkpoint_dir}: {name} is packed NVFP4 but {missing} are missing: the lint "
                                 "names it; this check cannot decode the weight")
            scale_2 = tensors[global_scale].float().reshape(())
            if producer in INVERTED_GLOBAL_SCALE:
                scale_2 = 1.0 / scale_2
            state[f"{module}.weight"] = vllm_nvfp4.dequantize(t, tensors[block_scale], scale_2,
                                                              torch.bfloat16)
        elif leaf not in producers.quantized_leaves(SCHEME):
            state[name] = t
    return state


def digest(state: dict[str, Any]) -> str:
    """Content hash of a state dict: checkpoints that decode to the same bf16 model are compared once."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(state.items()):
        h.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def dequant_error(state: dict[str, Any], bf16_dir: Path) -> LogitError:
    """Logits of the decoded model (built from the bf16 model's config.json, every tensor required) against the
    bf16 model's own, on the prompts the factory ships."""
    import tempfile

    from quantmatrix.checkpoints import base

    prompts = base.prompts()
    ids = base.encode(bf16_dir, prompts)
    ref = base.logits(base.load_hf(bf16_dir), ids)
    with tempfile.TemporaryDirectory(prefix="quantmatrix-dequant-") as tmp:
        base.write_hf(Path(tmp), {"config.json": json.loads((bf16_dir / "config.json").read_text())}, state, {})
        dq = base.logits(base.load_hf(Path(tmp)), ids)
    pairs = list(zip(dq, ref, strict=True))
    rel = max(((a - b).norm() / b.norm()).item() for a, b in pairs)
    top1 = sum((a.argmax(-1) == b.argmax(-1)).float().mean().item() for a, b in pairs) / len(pairs)
    return LogitError(rel, top1)
