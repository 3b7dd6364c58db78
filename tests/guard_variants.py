"""Checkpoints the guard's engine tests derive from the clean bf16 one (real safetensors files, vLLM-readable): the
same weights with a NaN final norm, and the same weights in FP8 (per-tensor F8_E4M3 weights with an F32
weight_scale, `quant_method: fp8`), built here so the guard's proof needs no other factory scheme."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def _copy(src: Path, dst: Path) -> dict[str, torch.Tensor]:
    shutil.copytree(src, dst)
    return load_file(str(dst / "model.safetensors"))


def nan_norm(src: Path, dst: Path) -> Path:
    """model.norm.weight all NaN: every token's final hidden state is NaN, and no MoE or linear layer holds it."""
    tensors = _copy(src, dst)
    tensors["model.norm.weight"] = torch.full_like(tensors["model.norm.weight"], float("nan"))
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def fp8(src: Path, dst: Path) -> Path:
    """Every Linear and expert projection (and the router) as float8_e4m3fn with its per-tensor scale."""
    tensors = _copy(src, dst)
    out = {}
    for name, t in tensors.items():
        if name.endswith(("proj.weight", "gate.weight")) and t.dim() == 2:
            scale = t.float().abs().max().clamp(min=1e-12) / FP8_MAX
            out[name] = (t.float() / scale).to(torch.float8_e4m3fn)
            out[name.removesuffix("weight") + "weight_scale"] = scale.reshape(())
        else:
            out[name] = t
    save_file(out, str(dst / "model.safetensors"))
    config = json.loads((dst / "config.json").read_text(encoding="utf-8"))
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    (dst / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return dst
