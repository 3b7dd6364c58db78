"""The bf16 tiny MoE every synthetic checkpoint of a family starts from: weights from a fixed seed, an
offline-trained tokenizer, and what HF transformers makes of them (calibration amax, greedy reference).

Going through transformers on purpose: the saved files are loaded back with `from_pretrained` before
anything is derived from them, so a naming or shape mistake fails here, not in a later tier.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import re
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from quantmatrix.checkpoints import gpt_oss
from quantmatrix.checkpoints.configs import plain_files
from quantmatrix.errors import QuantmatrixError

REFERENCE_FILE = "quantmatrix-reference.json"
GREEDY_TOKENS = 8
_SPECIAL = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: model_config's bos 1 / eos 2


class FactoryError(QuantmatrixError):
    """The factory produced something transformers does not accept (a bug here, not in the matrix)."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a model family keeps its MoE block and how it names the expert projections."""

    moe: str  # "mlp" (Qwen3-MoE) or "block_sparse_moe" (Mixtral)
    gate: str
    up: str
    down: str
    qk_norm: bool

    def expert(self, layer: int, expert: int, proj: str) -> str:
        return f"model.layers.{layer}.{self.moe}.experts.{expert}.{proj}"


LAYOUTS = {
    "qwen3_moe": Layout("mlp", "gate_proj", "up_proj", "down_proj", qk_norm=True),
    "mixtral": Layout("block_sparse_moe", "w1", "w3", "w2", qk_norm=False),
}


@dataclasses.dataclass(frozen=True)
class Dims:
    layers: int
    experts: int
    hidden: int
    expert_ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


def dims(config: dict[str, Any]) -> Dims:
    experts = config.get("num_experts", config.get("num_local_experts"))
    ffn = config.get("moe_intermediate_size", config["intermediate_size"])
    return Dims(config["num_hidden_layers"], experts, config["hidden_size"], ffn, config["num_attention_heads"],
                config["num_key_value_heads"], config["head_dim"], config["vocab_size"])


def linear_shapes(model: str, d: Dims) -> dict[str, tuple[int, int]]:
    """Every Linear of the model by HF module name -> (out, in); the quantizable set."""
    lay = LAYOUTS[model]
    out: dict[str, tuple[int, int]] = {}
    for layer in range(d.layers):
        attn = f"model.layers.{layer}.self_attn"
        out[f"{attn}.q_proj"] = (d.heads * d.head_dim, d.hidden)
        out[f"{attn}.k_proj"] = (d.kv_heads * d.head_dim, d.hidden)
        out[f"{attn}.v_proj"] = (d.kv_heads * d.head_dim, d.hidden)
        out[f"{attn}.o_proj"] = (d.hidden, d.heads * d.head_dim)
        out[f"model.layers.{layer}.{lay.moe}.gate"] = (d.experts, d.hidden)
        for e in range(d.experts):
            out[lay.expert(layer, e, lay.gate)] = (d.expert_ffn, d.hidden)
            out[lay.expert(layer, e, lay.up)] = (d.expert_ffn, d.hidden)
            out[lay.expert(layer, e, lay.down)] = (d.hidden, d.expert_ffn)
    out["lm_head"] = (d.vocab, d.hidden)
    return out


def _seed(seed: int, name: str) -> int:
    """One generator per tensor, so adding a tensor never shifts the values of the others."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def _normal(seed: int, name: str, shape: tuple[int, ...], std: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(_seed(seed, name))
    return (torch.randn(shape, generator=g, dtype=torch.float32) * std).to(torch.bfloat16)


def bf16_tensors(model: str, config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """HF-named bf16 state dict. Linear weights have std 1/sqrt(fan_in) (not HF's 0.02) so activations, and
    with them the greedy output and the quantization error, are not drowned in the residual stream."""
    if model == gpt_oss.MODEL:
        return gpt_oss.tensors(config, functools.partial(_normal, seed))
    d = dims(config)
    lay = LAYOUTS[model]
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": _normal(seed, "embed", (d.vocab, d.hidden), 1.0)}
    for name, (o, i) in linear_shapes(model, d).items():
        t[f"{name}.weight"] = _normal(seed, name, (o, i), 1 / math.sqrt(i))
    ones = functools.partial(torch.ones, dtype=torch.bfloat16)
    for layer in range(d.layers):
        t[f"model.layers.{layer}.input_layernorm.weight"] = ones(d.hidden)
        t[f"model.layers.{layer}.post_attention_layernorm.weight"] = ones(d.hidden)
        if lay.qk_norm:
            t[f"model.layers.{layer}.self_attn.q_norm.weight"] = ones(d.head_dim)
            t[f"model.layers.{layer}.self_attn.k_norm.weight"] = ones(d.head_dim)
    t["model.norm.weight"] = ones(d.hidden)
    return dict(sorted(t.items()))


# ------------------------------------------------------------------------------------------- tokenizer


def _data(name: str) -> str:
    return resources.files("quantmatrix.checkpoints").joinpath("data", name).read_text(encoding="utf-8")


def prompts() -> list[str]:
    """The fixed calibration / reference prompts shipped in the repo."""
    return [line for line in _data("prompts.txt").splitlines() if line.strip()]


@functools.cache
def tokenizer_files(vocab_size: int) -> dict[str, str]:
    """A byte-level BPE trained on the shipped corpus (deterministic; ~50 ms), as HF tokenizer files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(_SPECIAL), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_data("corpus.txt").splitlines(), trainer=trainer)
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": _SPECIAL[0], "bos_token": _SPECIAL[1],
           "eos_token": _SPECIAL[2], "pad_token": _SPECIAL[2], "model_max_length": 512,
           "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": tok.to_str(pretty=True) + "\n",
            "tokenizer_config.json": json.dumps(cfg, indent=2, sort_keys=True) + "\n"}


# -------------------------------------------------------------------------------------------- the model


@dataclasses.dataclass(frozen=True)
class Base:
    """One family's bf16 model and what was measured on it."""

    model: str
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    tokenizer: dict[str, str]
    # module name -> {"routed": amax over tokens the router sent there, "all": over every token}
    input_amax: dict[str, dict[str, float]]
    reference: dict[str, Any]


def write_hf(out: Path, json_files: dict[str, Any], tensors: dict[str, torch.Tensor],
             tokenizer: dict[str, str]) -> None:
    """An HF checkpoint directory: the JSON files (config.json, ...), model.safetensors, the tokenizer."""
    from safetensors.torch import save_file

    for name, content in json_files.items():
        (out / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
    for name, text in tokenizer.items():
        (out / name).write_text(text)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # save_file leaves 0600; a handed-over checkpoint is shared


def load_hf(path: Path) -> Any:
    """transformers' model from a checkpoint dir; any missing, unexpected or mismatched tensor is an error."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model, info = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16, attn_implementation="eager",
                                                       output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k != "error_msgs"} | (
        {"error_msgs": info["error_msgs"]} if info.get("error_msgs") else {})
    if problems:
        raise FactoryError(f"{path}: transformers did not load the checkpoint cleanly: {problems}")
    return model.eval()


_EXPERT_WEIGHT = re.compile(r"^(model\.layers\.\d+)\.(\w+)\.experts\.(\d+)\.(\w+)\.weight$")


def in_memory(model: str, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
    """transformers' model built from `config` in memory, its parameters set from `tensors` by quantmatrix's own
    reading of the layout (transformers 5 keeps each layer's experts fused: `mlp.experts.gate_up_proj[e]` =
    [gate; up], `mlp.experts.down_proj[e]`), never saved: hf_reference holds the files on disk, loaded through
    from_pretrained and its checkpoint conversion, against this. A tensor left over or a parameter left unset
    is an error. gpt-oss is stored fused already: its tensors are the state dict as they are."""
    from transformers import AutoConfig, AutoModelForCausalLM

    state = dict(tensors) if model == gpt_oss.MODEL else _fused_state(model, tensors)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), dtype=torch.bfloat16,
                                          attn_implementation="eager")
    hf.load_state_dict(state, strict=True)
    return hf.eval()


def _fused_state(model: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' state dict of a per-expert family: each layer's experts stacked into its fused tensors."""
    lay = LAYOUTS[model]
    state: dict[str, torch.Tensor] = {}
    experts: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for name, t in tensors.items():
        m = _EXPERT_WEIGHT.match(name)
        if m and m.group(2) == lay.moe:
            experts.setdefault((m.group(1), m.group(4)), {})[int(m.group(3))] = t
        else:
            state[name.replace(f".{lay.moe}.gate.", ".mlp.gate.")] = t
    for layer in sorted({layer for layer, _ in experts}):
        proj = {p: experts.pop((layer, p)) for p in (lay.gate, lay.up, lay.down)}
        n = len(proj[lay.gate])
        state[f"{layer}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([proj[lay.gate][e], proj[lay.up][e]]) for e in range(n)])
        state[f"{layer}.mlp.experts.down_proj"] = torch.stack([proj[lay.down][e] for e in range(n)])
    if experts:
        raise FactoryError(f"expert tensors of no {lay.gate}/{lay.up}/{lay.down} triple: {sorted(experts)}")
    return state


def encode(path_or_tokenizer: Path | dict[str, str], texts: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    if isinstance(path_or_tokenizer, dict):
        tok = Tokenizer.from_str(path_or_tokenizer["tokenizer.json"])
    else:
        tok = Tokenizer.from_file(str(path_or_tokenizer / "tokenizer.json"))
    return [tok.encode(t).ids for t in texts]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Tiny forwards on one intra-op thread: 5x faster than two contending ones on a 2-core runner, and the
    reduction order (hence the recorded greedy tokens) no longer depends on the machine's core count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@torch.no_grad()
def greedy(model: Any, input_ids: list[list[int]], steps: int = GREEDY_TOKENS) -> list[list[int]]:
    """Argmax continuation without a KV cache or stop tokens: the plainest greedy there is."""
    out = []
    with one_thread():
        for ids in input_ids:
            seq = torch.tensor([ids])
            for _ in range(steps):
                nxt = model(seq).logits[0, -1].argmax()
                seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
            out.append(seq[0, len(ids):].tolist())
    return out


@torch.no_grad()
def logits(model: Any, input_ids: list[list[int]]) -> list[torch.Tensor]:
    with one_thread():
        return [model(torch.tensor([ids])).logits[0].float() for ids in input_ids]


def _calibrate(model: Any, lay: Layout, d: Dims, input_ids: list[list[int]]) -> dict[str, dict[str, float]]:
    """Input amax of every Linear over the prompts, from hooks on transformers' own modules (ModelOpt and
    llm-compressor calibrate the same way: max calibration on the bf16 forward)."""
    stats: dict[str, dict[str, float]] = {}

    def note(name: str, kind: str, x: torch.Tensor) -> None:
        if x.numel():
            s = stats.setdefault(name, {"routed": 0.0, "all": 0.0})
            s[kind] = max(s[kind], x.abs().max().float().item())

    hooks = []
    for layer, block in enumerate(model.model.layers):
        attn = f"model.layers.{layer}.self_attn"

        def attn_hook(_m: Any, args: tuple, name: str = attn) -> None:
            for proj in ("q_proj", "k_proj", "v_proj"):
                note(f"{name}.{proj}", "routed", args[0])
                note(f"{name}.{proj}", "all", args[0])

        def o_hook(_m: Any, args: tuple, name: str = attn) -> None:
            note(f"{name}.o_proj", "routed", args[0])
            note(f"{name}.o_proj", "all", args[0])

        def experts_hook(mod: Any, args: tuple, layer: int = layer) -> None:
            hidden, top_k_index = args[0], args[1]
            for e in range(d.experts):
                routed = (top_k_index == e).any(-1)
                gate, up = torch.nn.functional.linear(hidden, mod.gate_up_proj[e]).chunk(2, dim=-1)
                inner = mod.act_fn(gate) * up
                for kind, rows in (("routed", routed), ("all", slice(None))):
                    note(lay.expert(layer, e, lay.gate), kind, hidden[rows])
                    note(lay.expert(layer, e, lay.up), kind, hidden[rows])
                    note(lay.expert(layer, e, lay.down), kind, inner[rows])

        hooks += [block.self_attn.q_proj.register_forward_pre_hook(attn_hook),
                  block.self_attn.o_proj.register_forward_pre_hook(o_hook),
                  block.mlp.experts.register_forward_pre_hook(experts_hook)]
    try:
        logits(model, input_ids)
    finally:
        for h in hooks:
            h.remove()
    return stats


@functools.cache
def base(model: str, size: str, seed: int) -> Base:
    """The family's bf16 model, built once per process: a family's variants share it."""
    import transformers

    files = plain_files(model, size)
    config = files["config.json"]
    d = dims(config)
    with one_thread():
        tensors = bf16_tensors(model, config, seed)
    tok = tokenizer_files(d.vocab)
    ids = encode(tok, prompts())
    with tempfile.TemporaryDirectory(prefix="quantmatrix-base-") as tmp:
        write_hf(Path(tmp), files, tensors, tok)
        hf = load_hf(Path(tmp))
        # gpt-oss's formats (MXFP4) have no static activation scales: nothing to calibrate
        amax = {} if model == gpt_oss.MODEL else _calibrate(hf, LAYOUTS[model], d, ids)
        reference = {"prompts": prompts(), "input_ids": ids, "greedy_ids": greedy(hf, ids),
                     "recorded_with": {"transformers": transformers.__version__, "torch": torch.__version__}}
    return Base(model, config, tensors, tok, amax, reference)
