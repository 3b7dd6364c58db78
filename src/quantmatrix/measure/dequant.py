"""The model a checkpoint's files decode to, and how far its logits stray from the bf16 model it was quantized
from: the measurement behind dequant_logits (checks.checkpoint judges it against the stated bounds). The packed
weights are decoded by vLLM's own dequantization (adapter.nvfp4, adapter.fp8) or, for packed integer exports
(WNA16, W4A8), unpacked by vLLM's own packing helpers (adapter.wna16) and decoded by the format's arithmetic, never
by the factory's unpack; W8A8 INT8 weights are stored unpacked and decode as code * per-channel scale."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from quantmatrix.checkpoints import producers
from quantmatrix.checkpoints.lint import SCHEME, Declared, declared
from quantmatrix.checkpoints.lint_int8 import INT8
from quantmatrix.checkpoints.lint_mxfp4 import MXFP4
from quantmatrix.checkpoints.lint_mxfp8 import MXFP8

# Producers whose stored global scale is the quantizing one: vLLM decodes with its inverse.
INVERTED_GLOBAL_SCALE = ("compressed-tensors",)
# FP8 scheme modules -> the weight block their scale covers (None: per tensor or per output channel).
FP8_BLOCKS: dict[str, tuple[int, int] | None] = {"fp8": None, "fp8_block": (128, 128)}


@dataclasses.dataclass(frozen=True)
class LogitError:
    """The decoded model's logits against the bf16 model's, on the factory's prompts."""

    rel_error: float  # max over prompts of ||dq - bf16|| / ||bf16||
    top1: float  # mean over prompts of the fraction of positions with the same argmax


def dequantized_state(checkpoint_dir: Path) -> dict[str, Any]:
    """The bf16 state dict the checkpoint's own files encode, every NVFP4 weight decoded by vLLM's dequantization
    (adapter.nvfp4), not by the factory's unpack; scales and activation scales dropped, other tensors as
    stored. A module whose scales do not fit its weight is a checkpoint that cannot be decoded (an error)."""
    import torch
    from safetensors.torch import load_file

    from quantmatrix.adapter import nvfp4 as vllm_nvfp4

    d = declared(checkpoint_dir)[0]
    producer = d.producer
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(checkpoint_dir.glob("*.safetensors")):
        tensors.update(load_file(file))
    if d.family == INT8:
        return _int8_state(checkpoint_dir, d, tensors)
    if d.weights is not None:
        return _wna16_state(checkpoint_dir, d, tensors)
    if d.family in (*FP8_BLOCKS, MXFP8):
        return _fp8_state(checkpoint_dir, d, tensors)
    if d.family == MXFP4:
        return _mxfp4_state(checkpoint_dir, d, tensors)
    names = producers.leaves(producer, SCHEME)
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


def _mxfp4_state(checkpoint_dir: Path, d: Declared, tensors: dict[str, Any]) -> dict[str, Any]:
    """gpt-oss's fused expert blocks decoded by vLLM's E2M1 unpacking and E8M0 descale (adapter.mxfp4), turned back
    into transformers' [experts, in, out]; biases and every bf16 tensor as stored."""
    from quantmatrix.adapter import mxfp4 as vllm_mxfp4
    from quantmatrix.checkpoints.gpt_oss import PROJECTIONS

    layout = producers.producer(d.producer).RECIPES[MXFP4]
    packed = {layout.leaf(p, role): (p, role) for p in PROJECTIONS for role in ("weight", "block_scale")}
    state = {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        proj, role = packed.get(leaf, ("", ""))
        if not proj:
            state[name] = t
        elif role == "weight":
            scales = tensors.get(f"{module}.{layout.leaf(proj, 'block_scale')}")
            if scales is None or tuple(scales.shape) != tuple(t.shape[:-1]):
                raise ValueError(f"{checkpoint_dir}: {name} has no E8M0 scale grid of shape {list(t.shape[:-1])}: "
                                 "the lint names it; this check cannot decode the weight")
            state[f"{module}.{proj}"] = vllm_mxfp4.dequantize_mxfp4(t, scales).transpose(-1, -2).contiguous()
    return state


class _Misfit(ValueError):
    """A scale that does not fit its weight, said as "has no ... grid of shape ...": the lint names it."""


def _scaled_state(checkpoint_dir: Path, d: Declared, tensors: dict[str, Any], codes: tuple[Any, str],
                  decode: Any) -> dict[str, Any]:
    """The bf16 state of an export whose weights are codes (their dtype and its name) times a stored scale: each
    decoded by `decode(weight, scale)`; scales and activation scales dropped (they scale inputs), other tensors as
    stored."""
    (dtype, word), names = codes, producers.leaves(d.producer, d.family)
    skip, state = producers.quantized_leaves(d.family), {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        if leaf == names["weight"] and t.dtype == dtype:
            scale = tensors.get(f"{module}.{names['block_scale']}")
            if scale is None:
                raise ValueError(f"{checkpoint_dir}: {name} is {word} but {module}.{names['block_scale']} is "
                                 "missing: the lint names it; this check cannot decode the weight")
            try:
                state[f"{module}.weight"] = decode(t, scale)
            except _Misfit as misfit:
                raise ValueError(f"{checkpoint_dir}: {name} {misfit}: the lint names it; this check cannot decode "
                                 "it") from None
        elif leaf not in skip:
            state[name] = t
    return state


def _fp8_state(checkpoint_dir: Path, d: Declared, tensors: dict[str, Any]) -> dict[str, Any]:
    """Every F8_E4M3 weight times its weight scale (per tensor, per channel or per 128x128 block) by vLLM's
    scaled_dequantize (adapter.fp8), or (MXFP8) its E8M0 scale per 32 inputs by vLLM's dequant_mxfp8_to_bf16
    (adapter.mxfp4)."""
    import torch

    from quantmatrix.adapter import fp8 as vllm_fp8
    from quantmatrix.adapter import mxfp4 as vllm_mx

    def decode(t: Any, scale: Any) -> Any:
        if d.family != MXFP8:
            return vllm_fp8.dequantize_fp8(t, scale, FP8_BLOCKS[d.family], torch.bfloat16)
        grid = (*t.shape[:-1], t.shape[-1] // 32)
        if tuple(scale.shape) != grid or scale.dtype != torch.uint8:
            raise _Misfit(f"has no U8 E8M0 scale grid of shape {list(grid)}")
        return vllm_mx.dequantize_mxfp8(t, scale)

    return _scaled_state(checkpoint_dir, d, tensors, (torch.float8_e4m3fn, "FP8"), decode)


def oriented(t: Any, words: tuple[str, ...], bits: int, slot_order: str) -> Any:
    """A stored WNA16 tensor as [out, in or groups]: unpacked along its packed dimension by vLLM's helpers,
    transposed where the producer stores the inputs (or groups) first."""
    packed_dim = next((i for i, w in enumerate(words) if w.endswith("/pack")), None)
    if packed_dim is not None:
        from quantmatrix.adapter import wna16 as vllm_wna16

        t = vllm_wna16.unpack(t, bits, packed_dim, slot_order)
    return t.T if words[0] in ("in", "in/pack", "groups") else t


def _wna16_state(checkpoint_dir: Path, d: Declared, tensors: dict[str, Any]) -> dict[str, Any]:
    """The bf16 state of an integer weight-only export: (code - zero) * scale per input's group, codes and zero
    points unpacked by vLLM (adapter.wna16) in the producer's slot order, zero 2**(bits-1) when symmetric (what
    vLLM's uint4b8 / uint8b128 kernels use), groups from g_idx where the export holds one."""
    import torch

    w = d.weights
    assert w is not None
    names, dims = producers.leaves(d.producer, d.family), producers.shapes(d.producer, d.family)
    pk = producers.packing(d.producer, d.family)
    skip = producers.quantized_leaves(d.family)
    state = {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        if leaf in skip and leaf != names["weight"]:
            continue
        if leaf != names["weight"] or t.dtype != torch.int32:
            state[name] = t
            continue
        scales, zeros = f"{module}.{names['block_scale']}", f"{module}.{names.get('zero_point')}"
        if scales not in tensors or (not w.symmetric and zeros not in tensors):
            raise ValueError(f"{checkpoint_dir}: {name} is packed int{w.bits} but its scales or zero points are "
                             "missing: the lint names it; this check cannot decode the weight")
        codes = oriented(t, dims["weight"][0], w.bits, pk["slot_order"])
        scale = oriented(tensors[scales], dims["block_scale"][0], w.bits, pk["slot_order"]).float()
        zero = torch.full_like(scale, 2 ** (w.bits - 1)) if w.symmetric else (
            oriented(tensors[zeros], dims["zero_point"][0], w.bits, pk["slot_order"]) + pk["zero_offset"])
        size = codes.shape[1] if w.group_size == -1 else w.group_size
        g_idx = tensors.get(f"{module}.{names.get('g_idx')}")
        group = (g_idx if g_idx is not None else torch.arange(codes.shape[1]) // size).long()
        state[f"{module}.weight"] = ((codes - zero[:, group]) * scale[:, group]).to(torch.bfloat16)
    return state


def _int8_state(checkpoint_dir: Path, d: Declared, tensors: dict[str, Any]) -> dict[str, Any]:
    """Each int8 weight of a W8A8 INT8 export times its per-channel scale ([out, 1] or [out])."""
    import torch

    def decode(t: Any, scale: Any) -> Any:
        return (t.float() * scale.float().reshape(-1, 1)).to(torch.bfloat16)

    return _scaled_state(checkpoint_dir, d, tensors, (torch.int8, "int8"), decode)


def digest(state: dict[str, Any]) -> str:
    """Content hash of a state dict: checkpoints that decode to the same bf16 model are compared once."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(state.items()):
        h.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def dequant_error(state: dict[str, Any], bf16_dir: Path, prompts: list[str]) -> LogitError:
    """Logits of the decoded model (built from the bf16 model's config.json, every tensor required) against the
    bf16 model's own, on `prompts` (the ones the factory ships: checkpoints.base.prompts)."""
    import tempfile

    from quantmatrix.checkpoints import base

    ids = base.encode(bf16_dir, prompts)
    ref = base.logits(base.load_hf(bf16_dir), ids)
    with tempfile.TemporaryDirectory(prefix="quantmatrix-dequant-") as tmp:
        base.write_hf(Path(tmp), {"config.json": json.loads((bf16_dir / "config.json").read_text())}, state, {})
        dq = base.logits(base.load_hf(Path(tmp)), ids)
    pairs = list(zip(dq, ref, strict=True))
    rel = max(((a - b).norm() / b.norm()).item() for a, b in pairs)
    top1 = sum((a.argmax(-1) == b.argmax(-1)).float().mean().item() for a, b in pairs) / len(pairs)
    return LogitError(rel, top1)
