"""The factory as plug-ins: every scheme and producer schema.factory names resolves to a module that keeps its
protocol; a new one plugs in with its module and one registry line; the matrix names a scheme's factory scheme as
data, refused with file:line when it is missing or impossible; store is where a checkpoint is assembled and
labelled."""

from __future__ import annotations

import json
import re
import sys
import types
from collections.abc import Iterator

import pytest
import torch
from matrixkit import SMALL, write

from quantmatrix.checkpoints import lint, producers, schemes, store
from quantmatrix.checkpoints.base import REFERENCE_FILE
from quantmatrix.checkpoints.producers import modelopt
from quantmatrix.checkpoints.schemes import Encoded
from quantmatrix.errors import MatrixError
from quantmatrix.schema import factory
from quantmatrix.schema.load import load
from quantmatrix.schema.synthetic import SyntheticSpec
from quantmatrix.schema.vocab import PRODUCERS, ROLES


@pytest.fixture
def fresh_tables() -> Iterator[None]:
    """The producers' cached tables, rebuilt around a test that registers a plug-in of its own."""
    for cached in (producers._roles, producers.quantized_leaves):
        cached.cache_clear()
    yield
    for cached in (producers._roles, producers.quantized_leaves):
        cached.cache_clear()


@pytest.mark.parametrize("name", sorted(factory.PRODUCERS))
def test_every_registered_producer_keeps_the_protocol(name):
    """Its module names a role -> leaf table and has a recipe for exactly the scheme modules the registry says it
    writes (none for an unquantized one), every role in the matrix's vocabulary, and writes its config files."""
    mod = producers.producer(name)
    assert set(mod.LEAVES) == set(factory.PRODUCERS[name].writes)
    quantized = {s.module for s in factory.SCHEMES.values() if s.quantized}
    assert set(mod.RECIPES) == set(factory.PRODUCERS[name].writes) & quantized
    assert all(set(names) <= set(ROLES) for names in mod.LEAVES.values())
    assert callable(mod.config_files)
    assert set(PRODUCERS) == set(factory.PRODUCERS)


@pytest.mark.parametrize("name", sorted(factory.SCHEMES))
def test_every_registered_scheme_has_an_encoder_and_a_producer(name):
    spec = SyntheticSpec(producer=next(p for p, d in factory.PRODUCERS.items()
                                       if factory.SCHEMES[name].module in d.writes), scheme=name,
                         model=factory.SCHEMES[name].models[0])
    assert spec.problem() is None
    assert callable(schemes.scheme(spec).encode)


def test_the_one_name_table_tells_every_leaf_s_role_and_which_leaves_are_quantized():
    """role_of is built from every producer's table; a bf16 `weight` is not evidence of quantization."""
    assert producers.quantized_leaves(lint.SCHEME) == {"weight_scale", "weight_scale_2", "input_scale",
                                                       "weight_packed", "weight_global_scale", "input_global_scale"}
    assert producers.writers(lint.SCHEME).keys() == {"modelopt", "compressed-tensors"}
    assert producers.leaves("compressed-tensors", "nvfp4")["global_scale"] == "weight_global_scale"


def test_a_leaf_in_two_roles_is_refused(monkeypatch, fresh_tables):
    """Two producers calling one leaf by two roles would make role_of guess: the table refuses, naming both."""
    odd = types.ModuleType("quantmatrix.checkpoints.producers.odd")
    odd.LEAVES = {"nvfp4": {"weight": "weight_scale"}}
    monkeypatch.setitem(sys.modules, odd.__name__, odd)
    monkeypatch.setitem(factory.PRODUCERS, "odd", factory.FactoryProducer("odd", writes=("nvfp4",)))
    with pytest.raises(ValueError, match="producer 'odd' names its nvfp4 weight 'weight_scale', which another "
                                         "producer uses for block_scale"):
        producers.role_of("w13_weight_scale")


def test_a_new_producer_is_one_module_and_one_registry_line(monkeypatch, fresh_tables):
    """A producer with its own NVFP4 names and config file (and ModelOpt's arithmetic) plugs in with a module and a
    schema.factory entry: the factory writes its names and config, role_of reads its leaves."""
    acme = types.ModuleType("quantmatrix.checkpoints.producers.acme")
    acme.LEAVES = {"nvfp4": {"weight": "qweight_fp4", "block_scale": "scales_e4m3", "global_scale": "scale_global",
                             "input_scale": "act_scale"}}
    acme.RECIPES = modelopt.RECIPES
    acme.config_files = lambda spec, plain: {**plain, "acme_quant.json": {"bits": 4, "acts": spec.activations}}
    monkeypatch.setitem(sys.modules, acme.__name__, acme)
    monkeypatch.setitem(factory.PRODUCERS, "acme", factory.FactoryProducer("acme", writes=("nvfp4",)))
    spec = SyntheticSpec(producer="acme", scheme="nvfp4_w4a4")
    assert spec.problem() is None
    made = store.contents(spec)
    assert made.json_files["acme_quant.json"] == {"bits": 4, "acts": "quantized"}
    ref = store.contents(SyntheticSpec(producer="modelopt", scheme="nvfp4_w4a4"))
    m = "model.layers.1.mlp.experts.2.down_proj"
    for role, leaf in acme.LEAVES["nvfp4"].items():
        assert torch.equal(made.tensors[f"{m}.{leaf}"], ref.tensors[f"{m}.{modelopt.LEAVES['nvfp4'][role]}"])
        assert producers.role_of(f"model.layers.1.mlp.experts.w2_{leaf}") == role


def test_a_new_scheme_is_one_module_and_one_registry_line(monkeypatch, fresh_tables):
    """A scheme module with an `encode` (here FP8 per-tensor weights) and a producer naming its roles plug in with
    two registry lines: store assembles, plants faults and writes configs around it unchanged."""
    def encode(spec, family, producer):
        names, tensors = producer.LEAVES["fp8"], dict(family.tensors)
        for m in schemes.targets(spec, family.config):
            w = tensors.pop(f"{m}.weight")
            scale = (w.abs().max().float() / 448.0).reshape(())
            tensors[f"{m}.{names['weight']}"] = (w.float() / scale).to(torch.float8_e4m3fn)
            tensors[f"{m}.{names['global_scale']}"] = scale
        return Encoded(tensors, dict(family.tensors))

    fp8 = types.ModuleType("quantmatrix.checkpoints.schemes.fp8")
    fp8.encode = encode
    maker = types.ModuleType("quantmatrix.checkpoints.producers.fp8maker")
    maker.LEAVES = {"fp8": {"weight": "weight", "global_scale": "weight_scale_fp8"}}
    maker.RECIPES = {"fp8": None}
    maker.config_files = lambda spec, plain: plain
    for mod in (fp8, maker):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(factory.SCHEMES, "fp8_weights", factory.FactoryScheme("fp8"))
    monkeypatch.setitem(factory.PRODUCERS, "fp8maker", factory.FactoryProducer("fp8maker", writes=("fp8",)))
    m = "model.layers.0.mlp.experts.1.up_proj"
    spec = SyntheticSpec(producer="fp8maker", scheme="fp8_weights", corrupt_tensors=((f"{m}.weight_scale_fp8", "nan"),))
    made = store.contents(spec)
    assert made.tensors[f"{m}.weight"].dtype == torch.float8_e4m3fn
    assert made.tensors[f"{m}.weight_scale_fp8"].isnan().all()
    assert made.dequantized is not None and REFERENCE_FILE not in made.json_files
    assert producers.role_of(f"{m}.weight_scale_fp8") == "global_scale"


# ------------------------------------------------------------------------------------- the matrix's words


def _replace(old: str, new: str) -> str:
    assert old in SMALL, old
    return SMALL.replace(old, new, 1)


BAD = [
    ("scheme-without-factory", _replace(", factory: nvfp4_w4a4,", ","), 27,
     "checkpoints[1].scheme: scheme 'nvfp4_w4a4' has no `factory:` (the factory scheme a synthetic checkpoint of it "
     "is built as: one of " + ", ".join(factory.SCHEMES) + ")"),
    ("unknown-factory", _replace("factory: nvfp4_w4a4", "factory: nvfp4_w4a8"), 15,
     "schemes[2].factory: expected one of " + ", ".join(factory.SCHEMES) + "; got 'nvfp4_w4a8' (did you mean "
     "'nvfp4_w4a4'?)"),
    ("producer-cannot-write-it", _replace("producer: modelopt\n    scheme: nvfp4_w4a4", "producer: none\n    scheme: "
                                          "nvfp4_w4a4"), 25,
     "producer 'none' writes no nvfp4 checkpoints (it writes bf16); a nvfp4_w4a4 one comes from modelopt, "
     "compressed-tensors"),
    ("key-of-another-producer", _replace("{synthetic: {model: qwen3_moe}}\n    producer: modelopt\n    scheme: "
                                         "nvfp4_w4a4", "{synthetic: {quant_algo: NVFP4}}\n    producer: "
                                         "compressed-tensors\n    scheme: nvfp4_w4a4"), 25,
     "quant_algo is a key of producer modelopt only; producer is 'compressed-tensors'"),
    ("fault-on-nothing-quantized", _replace("{synthetic: {model: qwen3_moe}}\n    producer: modelopt\n    scheme: "
                                            "nvfp4_w4a4", "{synthetic: {omit_tensors: [lm_head.weight]}}\n    "
                                            "producer: none\n    scheme: bf16"), 25,
     "omit_tensors and input_scales act on quantized tensors; a bf16 checkpoint has none"),
]


@pytest.mark.parametrize(("text", "line", "fragment"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_missing_or_impossible_factory_scheme_names_file_and_line(tmp_path, text, line, fragment):
    path = write(tmp_path, text)
    with pytest.raises(MatrixError) as info:
        load(path)
    assert re.match(rf"{re.escape(str(path))}:{line}:\d+: ", str(info.value)), str(info.value)
    assert fragment in str(info.value), str(info.value)


def test_a_spec_made_in_code_with_an_unregistered_factory_scheme_says_so():
    """Outside the loader (which refuses it at file:line), a spec naming no registered factory scheme says which
    exist instead of failing on a lookup."""
    assert SyntheticSpec(producer="modelopt", scheme="nvfp4_w4a16").problem() == (
        "factory scheme 'nvfp4_w4a16' is none of " + ", ".join(factory.SCHEMES))


def test_a_hub_only_scheme_needs_no_factory(tmp_path):
    """`factory:` matters only to synthetic checkpoints: a scheme of hub and path checkpoints may leave it out."""
    text = _replace(", factory: nvfp4_w4a4,", ",").replace(
        "source: {synthetic: {model: qwen3_moe}}\n    producer: modelopt\n    scheme: nvfp4_w4a4",
        "source: {path: .}\n    producer: modelopt\n    scheme: nvfp4_w4a4")
    assert load(write(tmp_path, text)).checkpoints[1].scheme.factory is None


# ------------------------------------------------------------------------------------------------ store


def test_store_labels_the_family_base_and_the_twin(tmp_path, monkeypatch):
    """The bf16 member is `base-<model>-<size>-seed<n>`; the twin at another size is `<id>-<size>` and has that
    size's config; a checkpoint already of that size, or not synthetic, is its own (None)."""
    monkeypatch.setenv("QUANTMATRIX_CACHE", str(tmp_path / "cache"))
    m = load(write(tmp_path))
    wo = m.checkpoints[0]
    assert store.base_of(wo).name.startswith("base-qwen3_moe-cpu_tiny-seed0-")
    assert json.loads((store.base_of(wo) / "config.json").read_text()).get("quantization_config") is None
    twin = store.twin(wo, "gpu_tiny")
    assert twin is not None and twin.name.startswith("tiny-wo-gpu_tiny-")
    assert json.loads((twin / "config.json").read_text())["hidden_size"] == 128
    assert store.twin(wo, "cpu_tiny") is None
    local = load(write(tmp_path, SMALL.replace("{synthetic: {model: qwen3_moe}}", "{path: .}"), "p.yaml"))
    assert store.twin(local.checkpoints[0], "gpu_tiny") is None


def test_contents_is_exactly_what_write_puts_on_disk(tmp_path):
    """The in-memory checkpoint (hf_reference's source) and the written one are one assembly."""
    from safetensors.torch import load_file

    spec = SyntheticSpec(producer="compressed-tensors", scheme="nvfp4_weight_only", model="mixtral",
                         corrupt_tensors=(("model.layers.0.block_sparse_moe.experts.0.w1.weight_global_scale",
                                           "zero"),))
    store.write(spec, tmp_path)
    made = store.contents(spec)
    on_disk = load_file(str(tmp_path / "model.safetensors"))
    assert on_disk.keys() == made.tensors.keys() and all(torch.equal(on_disk[k], made.tensors[k]) for k in on_disk)
    for name, content in made.json_files.items():
        assert json.loads((tmp_path / name).read_text()) == content
    assert made.dequantized is not None and set(made.dequantized.json_files) == {"config.json",
                                                                                 "generation_config.json"}
    assert REFERENCE_FILE in store.contents(store.base_spec(spec)).json_files
