"""transformers' greedy output of a checkpoint: the measurements behind hf_reference (the bf16 model from its
files against the same weights built in memory, never saved) and the e2e tier's `transformers` references (greedy
continuations with top-k logprobs, independent of vLLM and of the hardware)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantmatrix.checkpoints import store
from quantmatrix.checkpoints.store import DEQUANTIZED
from quantmatrix.schema.synthetic import SyntheticSpec


@dataclasses.dataclass(frozen=True)
class HfGreedy:
    """Greedy continuations of the shipped prompts by the model transformers loads from the checkpoint's files
    (`from_files`) and by the same weights built in memory from the factory's tensors (`in_memory`); both empty
    when tokenizer.json on disk encodes the prompts differently from the factory's tokenizer."""

    prompts: list[str]
    tokenizer_agrees: bool
    from_files: list[list[int]]
    in_memory: list[list[int]]


def hf_greedy(path: Path, spec: SyntheticSpec) -> HfGreedy:
    """from_pretrained and its checkpoint conversion against a forward the write/load path took no part in."""
    from quantmatrix.checkpoints import base

    prompts, factory_ids, in_memory = factory_greedy(spec)
    ids = base.encode(path, prompts)
    if ids != factory_ids:
        return HfGreedy(prompts, False, [], [])
    return HfGreedy(prompts, True, base.greedy(base.load_hf(path), ids), in_memory)


def factory_greedy(spec: SyntheticSpec) -> tuple[list[str], list[list[int]], list[list[int]]]:
    """The shipped prompts, their ids under the factory's own tokenizer, and the greedy continuation of the
    spec's weights built in memory (never saved): what hf_reference holds the files against."""
    from quantmatrix.checkpoints import base

    made = store.contents(spec)
    prompts = base.prompts()
    ids = base.encode(made.tokenizer, prompts)
    return prompts, ids, base.greedy(base.in_memory(spec.model, made.json_files["config.json"], made.tensors), ids)


def transformers_greedy(model_dir: Path, prompts: Sequence[str], max_tokens: int, k: int) -> dict[str, Any]:
    """Greedy continuations by HF transformers (argmax of raw logits, EOS ignored, as the engine runs them),
    with the top-k logprobs of every position; the prompts are tokenized by the checkpoint's own tokenizer."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    from quantmatrix.checkpoints import base

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = base.load_hf(model_dir)
    outputs = []
    with torch.no_grad():
        for text in prompts:
            ids = tok(text)["input_ids"]
            seq, past, tokens, logprobs = torch.tensor([ids]), None, [], []
            for _ in range(max_tokens):
                out = model(seq, past_key_values=past, use_cache=True)
                past = out.past_key_values
                lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
                nxt = int(lp.argmax())
                values, idx = lp.topk(k)
                logprobs.append({str(int(i)): float(v) for v, i in zip(values, idx, strict=True)})
                tokens.append(nxt)
                seq = torch.tensor([[nxt]])
            outputs.append({"prompt_token_ids": ids, "token_ids": tokens, "logprobs": logprobs,
                            "text": tok.decode(tokens)})
    weights = "dequantized/" if model_dir.name == DEQUANTIZED else "the checkpoint's own bf16 weights"
    return {"outputs": outputs, "produced_by": {"source": "transformers", "transformers": transformers.__version__,
                                                "torch": torch.__version__, "weights": weights}}
