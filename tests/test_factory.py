"""The synthetic checkpoint factory: names, dtypes, shapes and scale conventions per producer, the variant
flags, determinism, the content-addressed atomic cache, and `quantmatrix checkpoint make/list`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import textwrap
from pathlib import Path

import pytest
import torch
from matrixkit import case_for
from safetensors import safe_open

from quantmatrix import cli
from quantmatrix.checkpoints import base, lint, make, store
from quantmatrix.checkpoints.base import LAYOUTS, REFERENCE_FILE
from quantmatrix.checkpoints.schemes import nvfp4
from quantmatrix.checks import checkpoint as verify
from quantmatrix.errors import MatrixError, QuantmatrixError
from quantmatrix.measure import dequant, hf
from quantmatrix.schema.load import load
from quantmatrix.schema.synthetic import SyntheticSpec

ROOT = Path(__file__).resolve().parents[1]
MO = dict(producer="modelopt", scheme="nvfp4_w4a4")
CT = dict(producer="compressed-tensors", scheme="nvfp4_w4a4")


def build(tmp_path: Path, name: str = "ck", **fields) -> Path:
    out = tmp_path / name
    out.mkdir()
    store.write(SyntheticSpec(**fields), out)
    return out


def tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("model", ["qwen3_moe", "mixtral"])
def test_modelopt_names_dtypes_shapes(tmp_path, model):
    """ModelOpt W4A4: per-expert `<prefix>.experts.E.<proj>` with U8 weight [o, i/2], F8_E4M3 weight_scale
    [o, i/16], F32 0-d weight_scale_2 and input_scale; router, attention and lm_head stay bf16."""
    t = tensors(build(tmp_path, model=model, **MO))
    lay = LAYOUTS[model]
    for proj, (o, i) in ((lay.gate, (64, 64)), (lay.up, (64, 64)), (lay.down, (64, 64))):
        m = lay.expert(1, 3, proj)
        assert t[f"{m}.weight"].dtype == torch.uint8 and t[f"{m}.weight"].shape == (o, i // 2)
        assert t[f"{m}.weight_scale"].dtype == torch.float8_e4m3fn and t[f"{m}.weight_scale"].shape == (o, i // 16)
        for leaf in ("weight_scale_2", "input_scale"):
            assert t[f"{m}.{leaf}"].dtype == torch.float32 and t[f"{m}.{leaf}"].shape == ()
    assert t[f"model.layers.0.{lay.moe}.gate.weight"].dtype == torch.bfloat16
    assert t["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert t["lm_head.weight"].dtype == torch.bfloat16


def test_compressed_tensors_names_and_inverse_global_scale(tmp_path):
    """compressed-tensors: weight_packed / weight_global_scale [1] = 6*448/amax (the inverse of ModelOpt's
    weight_scale_2) / input_global_scale [1]; an expert's gate and up share one global scale."""
    t = tensors(build(tmp_path, model="qwen3_moe", **CT))
    m = "model.layers.0.mlp.experts.2"
    gate = t[f"{m}.gate_proj.weight_global_scale"]
    assert gate.shape == (1,) and torch.equal(gate, t[f"{m}.up_proj.weight_global_scale"])
    assert t[f"{m}.down_proj.input_global_scale"].shape == (1,)
    assert not any(k.endswith((".weight_scale_2", ".input_scale")) for k in t)
    bf16 = tensors(build(tmp_path, "bf16", producer="none", scheme="bf16"))
    amax = torch.maximum(bf16[f"{m}.gate_proj.weight"].abs().max(), bf16[f"{m}.up_proj.weight"].abs().max())
    assert gate.item() == pytest.approx(6 * 448 / amax.item(), rel=2**-8)  # bf16-rounded, as the package does


def test_modelopt_scales_follow_the_amax_convention(tmp_path):
    """weight_scale_2 = max(amax(gate), amax(up)) / (6*448) exactly; input_scale is one calibrated value per
    projection shared by the layer's experts (ModelOpt syncs expert input amax)."""
    t = tensors(build(tmp_path, model="qwen3_moe", **MO))
    bf16 = tensors(build(tmp_path, "bf16", producer="none", scheme="bf16"))
    m = "model.layers.1.mlp.experts.0"
    amax = torch.maximum(bf16[f"{m}.gate_proj.weight"].abs().max(), bf16[f"{m}.up_proj.weight"].abs().max())
    assert torch.equal(t[f"{m}.gate_proj.weight_scale_2"], amax.float() / 2688.0)
    inputs = {t[f"model.layers.1.mlp.experts.{e}.down_proj.input_scale"].item() for e in range(4)}
    assert len(inputs) == 1 and inputs.pop() > 0


def test_dequantized_is_the_exported_tensors_dequantized(tmp_path):
    """dequantized/ holds, for every quantized module, exactly nvfp4.dequantize of the stored tensors (vLLM's
    arithmetic, with 1/weight_global_scale for compressed-tensors), and the bf16 weights elsewhere."""
    for name, fields in (("mo", MO), ("ct", CT)):
        ck = build(tmp_path, name, model="mixtral", **fields)
        q, dq = tensors(ck), tensors(ck / store.DEQUANTIZED)
        m = "model.layers.0.block_sparse_moe.experts.1.w2"
        if name == "mo":
            want = nvfp4.dequantize(q[f"{m}.weight"], q[f"{m}.weight_scale"], q[f"{m}.weight_scale_2"])
        else:
            want = nvfp4.dequantize(q[f"{m}.weight_packed"], q[f"{m}.weight_scale"], 1 / q[f"{m}.weight_global_scale"])
        assert torch.equal(dq[f"{m}.weight"], want)
        assert torch.equal(dq["lm_head.weight"], q["lm_head.weight"])
        assert "quantization_config" not in json.loads((ck / store.DEQUANTIZED / "config.json").read_text())


def test_quantize_attention_flag(tmp_path):
    """`quantize: experts_attention` also quantizes q/k/v/o; q, k and v share weight_scale_2 and input_scale."""
    t = tensors(build(tmp_path, model="qwen3_moe", quantize="experts_attention", **MO))
    a = "model.layers.0.self_attn"
    assert t[f"{a}.o_proj.weight"].dtype == torch.uint8
    for leaf in ("weight_scale_2", "input_scale"):
        assert torch.equal(t[f"{a}.q_proj.{leaf}"], t[f"{a}.v_proj.{leaf}"])


def test_input_scale_flags(tmp_path):
    """input_scales: auto follows the scheme, absent drops them from a W4A4 export, present adds them to a
    weight-only one; omit_tensors removes exactly the matched tensors."""
    def count(**f):
        return sum(k.endswith(".input_scale") for k in tensors(build(tmp_path, str(len(list(tmp_path.iterdir()))),
                                                                       producer="modelopt", **f)))
    assert count(scheme="nvfp4_w4a4") == 24
    assert count(scheme="nvfp4_weight_only") == 0
    assert count(scheme="nvfp4_w4a4", input_scales="absent") == 0
    assert count(scheme="nvfp4_weight_only", input_scales="present") == 24
    assert count(scheme="nvfp4_w4a4", omit_tensors=("model.layers.1.mlp.experts.3.*.input_scale",)) == 21


def test_corrupt_flags(tmp_path):
    """corrupt_tensors sets every element to zero / inf / NaN, or cuts a block scale's last column and
    doubles a scalar."""
    m = "model.layers.0.mlp.experts.0"
    t = tensors(build(tmp_path, model="qwen3_moe", **MO, corrupt_tensors=(
        (f"{m}.gate_proj.weight_scale_2", "zero"), (f"{m}.up_proj.input_scale", "inf"),
        (f"{m}.down_proj.weight_scale", "nan"), (f"{m}.down_proj.input_scale", "shape"),
        ("model.layers.1.mlp.experts.0.down_proj.weight_scale", "shape"))))
    assert t[f"{m}.gate_proj.weight_scale_2"].item() == 0.0
    assert t[f"{m}.up_proj.input_scale"].item() == float("inf")
    assert t[f"{m}.down_proj.weight_scale"].float().isnan().all()
    assert t[f"{m}.down_proj.input_scale"].shape == (2,)
    assert t["model.layers.1.mlp.experts.0.down_proj.weight_scale"].shape == (64, 3)


@pytest.mark.parametrize("fields, message", [
    (dict(omit_tensors=("*.experts.9.*",)), "matches no tensor"),
    (dict(corrupt_tensors=(("*.experts.0.down_proj.weight_scale", "inf"),)), "has no inf"),
    (dict(corrupt_tensors=(("*.experts.0.down_proj.weight", "nan"),)), "needs a floating tensor"),
])
def test_impossible_variants_are_matrix_errors(tmp_path, fields, message):
    """A variant flag that cannot take effect fails the build with the reason, instead of writing a clean
    checkpoint that a check would then wrongly pass."""
    with pytest.raises(MatrixError, match=message):
        build(tmp_path, model="qwen3_moe", **MO, **fields)


def test_same_spec_same_bytes(tmp_path):
    """Two builds of one spec are byte-identical, even with the family rebuilt from scratch (fixed seed,
    deterministic tokenizer training)."""
    from quantmatrix.checkpoints import base

    def digest(d: Path) -> dict[str, str]:
        return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
                if p.is_file()}
    first = digest(build(tmp_path, "a", model="mixtral", **CT))
    base.base.cache_clear()
    base.tokenizer_files.cache_clear()
    assert digest(build(tmp_path, "b", model="mixtral", **CT)) == first
    other = build(tmp_path, "c", model="mixtral", seed=1, **CT)
    assert digest(other)["model.safetensors"] != first["model.safetensors"]


def _hf_reference(ck: Path, spec: SyntheticSpec) -> tuple[list[list[int]], str | None]:
    """What hf_reference measures (measure.hf) and the problem its verdict finds in it."""
    measured = hf.hf_greedy(ck, spec)
    case = case_for(load(ROOT / "matrices" / "default.yaml"), "qwen3moe-tiny-bf16", "hf_reference")
    return measured.from_files, verify.hf_verdict(case, measured).problem


def test_bf16_checkpoint_records_the_hf_reference(tmp_path):
    """A bf16 checkpoint carries the greedy continuation transformers produced, and the tokenizer files put
    <unk>/<s>/</s> at ids 0/1/2 as config.json says; loaded from its files it continues the prompts as its
    in-memory model (never saved) does."""
    spec = SyntheticSpec(producer="none", scheme="bf16", model="qwen3_moe")
    ck = tmp_path / "ck"
    ck.mkdir()
    store.write(spec, ck)
    ref = json.loads((ck / REFERENCE_FILE).read_text())
    assert len(ref["greedy_ids"]) == len(ref["prompts"]) and all(len(g) == 8 for g in ref["greedy_ids"])
    vocab = json.loads((ck / "tokenizer.json").read_text())["model"]["vocab"]
    assert [vocab["<unk>"], vocab["<s>"], vocab["</s>"]] == [0, 1, 2]
    got, problem = _hf_reference(ck, spec)
    assert problem is None and got == ref["greedy_ids"]


def test_hf_reference_fails_when_the_files_do_not_hold_the_in_memory_model(tmp_path):
    """The reference is the in-memory model, not a recording of the same save/load path: a checkpoint whose
    files swap one expert's gate and up projections (a naming bug transformers loads without complaint) fails."""
    spec = SyntheticSpec(producer="none", scheme="bf16", model="mixtral")
    ck = tmp_path / "ck"
    ck.mkdir()
    store.write(spec, ck)
    t = tensors(ck)
    for layer in (0, 1):
        for e in range(4):
            gate, up = LAYOUTS["mixtral"].expert(layer, e, "w1"), LAYOUTS["mixtral"].expert(layer, e, "w3")
            t[f"{gate}.weight"], t[f"{up}.weight"] = t[f"{up}.weight"], t[f"{gate}.weight"]
    from safetensors.torch import save_file

    save_file(t, str(ck / "model.safetensors"), metadata={"format": "pt"})
    got, problem = _hf_reference(ck, spec)
    assert problem.startswith("greedy output of the model loaded from its files differs from the same weights' "
                              "in-memory model (never saved):")
    assert "in memory [" in problem and "from the files [" in problem
    assert all(row.startswith("  '") for row in problem.splitlines()[1:]) and len(problem.splitlines()) > 2
    (ck / "tokenizer.json").write_text(base.tokenizer_files(300)["tokenizer.json"])
    assert _hf_reference(ck, spec) == ([], "tokenizer.json on disk encodes the prompts differently from the "
                                           "tokenizer the factory trains")


def _dequant_problem(err: dequant.LogitError) -> str | None:
    case = case_for(load(ROOT / "matrices" / "default.yaml"), "qwen3moe-tiny-nvfp4-w4a4", "dequant_logits")
    return verify.dequant_verdict(case, err).problem


def test_logit_bound_rejects_a_layout_bug_the_packer_makes_both_ways(tmp_path, monkeypatch):
    """dequant_logits decodes the files with vLLM's own dequantization, not the factory's unpack: a factory
    whose pack and unpack both swap the nibble order (consistent with itself, so its dequantized/ copy matches
    the bf16 model) writes a checkpoint whose logits stray far past verify.LOGIT_REL_ERROR_BOUND."""
    bf16 = build(tmp_path, "bf16", producer="none", scheme="bf16", model="qwen3_moe")
    ck = build(tmp_path, "ck", model="qwen3_moe", **MO)
    assert _dequant_problem(dequant.dequant_error(dequant.dequantized_state(ck), bf16, base.prompts())) is None

    def swap(packed: torch.Tensor) -> torch.Tensor:
        return (packed >> 4) | (packed << 4)

    pack, unpack = nvfp4.pack, nvfp4.unpack
    monkeypatch.setattr(nvfp4, "pack", lambda codes: swap(pack(codes)))
    monkeypatch.setattr(nvfp4, "unpack", lambda packed: unpack(swap(packed)))
    bad = build(tmp_path, "bad", model="qwen3_moe", **MO)
    assert torch.equal(tensors(bad / store.DEQUANTIZED)["model.layers.0.mlp.experts.0.up_proj.weight"],
                       tensors(ck / store.DEQUANTIZED)["model.layers.0.mlp.experts.0.up_proj.weight"])
    err = dequant.dequant_error(dequant.dequantized_state(bad), bf16, base.prompts())
    assert err.rel_error > 2 * verify.LOGIT_REL_ERROR_BOUND and err.top1 < verify.TOP1_AGREEMENT_BOUND
    assert "strays from bf16" in _dequant_problem(err)


MATRIX = textwrap.dedent("""\
    version: 1
    archs: [{name: sm120, capability: "12.0", label: RTX PRO 6000}]
    modes: [{name: eager, label: eager}]
    schemes:
      - {name: nvfp4_w4a4, marker: w4a4, label: W4A4, factory: nvfp4_w4a4, expect: {resolves_to: w4a4, lint: []}}
    checks: [{name: checkpoint_lint, kind: lint, tier: cpu, description: lint}]
    checkpoints:
      - id: tiny-w4a4-hole
        source:
          synthetic:
            model: mixtral
            omit_tensors: ["model.layers.0.block_sparse_moe.experts.1.w2.input_scale"]
            corrupt_tensors: {"model.layers.1.block_sparse_moe.experts.0.w1.weight_scale_2": %s}
        producer: modelopt
        scheme: nvfp4_w4a4
        expect: {lint: [missing_tensor, bad_value, inconsistent]}
    """)


def test_matrix_flags_reach_the_spec(tmp_path):
    """The new synthetic keys parse from YAML into the spec (lists -> tuples, the fault mapping -> pairs)."""
    (tmp_path / "m.yaml").write_text(MATRIX % "nan")
    ck = load(tmp_path / "m.yaml").checkpoints[0]
    spec = store.spec_of(ck)
    assert spec.omit_tensors == ("model.layers.0.block_sparse_moe.experts.1.w2.input_scale",)
    assert spec.corrupt_tensors == (("model.layers.1.block_sparse_moe.experts.0.w1.weight_scale_2", "nan"),)
    assert ck.expectation("lint") == ("missing_tensor", "bad_value", "inconsistent")


def test_unknown_fault_is_a_matrix_error_with_line(tmp_path):
    """A misspelt fault names the file, line and the closest valid fault."""
    (tmp_path / "m.yaml").write_text(MATRIX % "nann")
    with pytest.raises(MatrixError, match=r"m\.yaml:13:\d+: .*corrupt_tensors.*'nann' \(did you mean 'nan'\?\)"):
        load(tmp_path / "m.yaml")


def test_cache_is_content_addressed_and_atomic(tmp_path, monkeypatch):
    """materialize builds once; a second call is a hash check (build is never called); a build killed midway
    leaves neither a trusted entry nor its temp dir; a leftover without the completion marker is rebuilt."""
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path / "cache"))
    spec = SyntheticSpec(model="mixtral", **MO)
    first = store.materialize_spec(spec, "x")
    assert (first / store.DEQUANTIZED / "model.safetensors").is_file()

    def refuse(*_a, **_k):
        raise AssertionError("rebuilt a cached spec")
    monkeypatch.setattr(store, "build", refuse)
    assert store.materialize_spec(spec, "x") == first
    monkeypatch.undo()
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path / "cache"))

    other = dataclasses.replace(spec, seed=5)

    def killed(_spec, out):
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt
    monkeypatch.setattr(store, "write", killed)
    with pytest.raises(KeyboardInterrupt):
        store.materialize_spec(other, "x")
    assert sorted(p.name for p in (tmp_path / "cache" / "checkpoints").iterdir()) == [first.name]
    monkeypatch.undo()
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path / "cache"))
    stale = first.parent / f"x-{store.digest(other)[:16]}"
    stale.mkdir()
    (stale / "config.json").write_text("{}")  # half a checkpoint, no marker
    rebuilt = store.materialize_spec(other, "x")
    assert rebuilt == stale and (rebuilt / "model.safetensors").is_file()


def test_checkpoint_make_and_list(tmp_path, capsys):
    """`checkpoint make NAME --out DIR` writes a checkpoint the lint reads as the matrix expects; it refuses
    a non-empty DIR and suggests the closest id for a typo; `checkpoint list` names every checkpoint."""
    (tmp_path / "m.yaml").write_text(MATRIX % "zero")
    out = tmp_path / "handed-over"
    make_args = ["checkpoint", "make", "tiny-w4a4-hole", "--out", str(out), "--matrix", str(tmp_path / "m.yaml")]
    assert cli.main(make_args) == 0
    assert lint.lint(out).codes() == {"missing_tensor", "bad_value", "inconsistent"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert cli.main(make_args) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert cli.main(["checkpoint", "make", "tiny-w4a4-hol", "--out", str(tmp_path / "o"), "--matrix",
                          str(tmp_path / "m.yaml")]) == 2
    assert "did you mean 'tiny-w4a4-hole'" in capsys.readouterr().err
    assert cli.main(["checkpoint", "list", "--matrix", str(tmp_path / "m.yaml")]) == 0
    assert capsys.readouterr().out.startswith("tiny-w4a4-hole\tmodelopt\tnvfp4_w4a4\tsynthetic model=mixtral")


def test_make_refuses_non_synthetic(tmp_path):
    """A path or hub checkpoint cannot be `made`; the error says which kind it is."""
    doc = (MATRIX % "zero").split("checkpoints:\n")[0] + textwrap.dedent("""\
        checkpoints:
          - {id: local, source: {path: .}, producer: modelopt, scheme: nvfp4_w4a4}
        """)
    (tmp_path / "m.yaml").write_text(doc)
    with pytest.raises(QuantmatrixError, match="path source, not synthetic"):
        make.make(load(tmp_path / "m.yaml"), "local", tmp_path / "o")
