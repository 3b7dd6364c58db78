"""Converters and field tables of the matrix's nodes: each turns a YAML node into a value or raises a
MatrixError at the node's file:line:column. schema.load applies them section by section."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from quantmatrix import bounded
from quantmatrix.schema import e2e, synthetic
from quantmatrix.schema.limits import ID_CHARS, NAME_CHARS
from quantmatrix.schema.model import NumericsBounds, PerArch, Selector, Source, TensorFinding
from quantmatrix.schema.vocab import (
    ACTIVATION_SCALES,
    AUDIT_FAILURES,
    LINT_CODES,
    RESOLUTIONS,
    SELECTOR_KEYS,
    bad_hub_repo,
    bad_hub_revision,
)
from quantmatrix.schema.yamldoc import Doc, Field, as_bool, as_text, fraction, list_of, matching, one_of, positive, show

# Marks pytest itself owns: an axis value with one of these names would change test behaviour.
_RESERVED_MARKERS = {"skip", "skipif", "xfail", "parametrize", "usefixtures", "filterwarnings", "tryfirst",
                     "trylast", "and", "or", "not", "true", "false", "none"}
_NAME = re.compile(rf"[A-Za-z_][A-Za-z0-9_]{{0,{NAME_CHARS - 1}}}\Z")
_ID = re.compile(rf"[a-z0-9][a-z0-9._-]{{0,{ID_CHARS - 1}}}\Z")

name = matching(_NAME, f"a name (letters, digits and _, not starting with a digit, at most {NAME_CHARS} characters)")
id_ = matching(_ID, f"an id (lower-case letters, digits, '.', '_' and '-', at most {ID_CHARS} characters)")


def marker(doc: Doc, node: yaml.Node, what: str) -> str:
    value = name(doc, node, what)
    if value.lower() in _RESERVED_MARKERS:
        raise doc.error(node, f"{what}: {value!r} is reserved by pytest or its -m grammar; choose another name")
    return value


def capability(doc: Doc, node: yaml.Node, what: str) -> tuple[int, int]:
    if isinstance(node, yaml.SequenceNode):
        parts = [doc.typed(n, what, (int,), "an integer") for n in node.value]
    else:
        value = doc.scalar(node, what)
        if isinstance(value, float):
            raise doc.error(node, f"{what}: write the capability as a string ('12.1') or a list ([12, 1]); "
                                  f"a bare {value!r} is a float and loses '12.10' vs '12.1'")
        parts = str(value).split(".") if isinstance(value, str) else []
        if not all(re.fullmatch(r"[0-9]{1,3}", p) for p in parts):  # ASCII digits: "1.²" isdigit()s
            raise doc.error(node, f"{what}: expected 'MAJOR.MINOR' or [MAJOR, MINOR], got {show(value)}")
        parts = [int(p) for p in parts]
    if len(parts) != 2:
        raise doc.error(node, f"{what}: expected two numbers (major, minor), got {len(parts)}")
    return (parts[0], parts[1])


def _globs(doc: Doc, node: yaml.Node, what: str) -> tuple[str, ...]:
    if isinstance(node, yaml.SequenceNode):
        return list_of(as_text)(doc, node, what)
    return (as_text(doc, node, what),)


def selector(doc: Doc, node: yaml.Node, what: str, extra: Mapping[str, Field] | None = None
             ) -> tuple[Selector, dict[str, yaml.Node], dict[str, Any]]:
    """The selector, the node of each key given (for errors), and the values of the `extra` keys the entry may hold
    beside its patterns (a cpu_cells entry's `needs`)."""
    rec = doc.record(node, what, {**{k: Field(_globs, "glob or list of globs", required=False)
                                     for k in SELECTOR_KEYS}, **(extra or {})})
    pats = {k: rec[k] for k in SELECTOR_KEYS if rec[k] is not None}
    nodes = {k[1:]: n for k, n in rec.items() if k.startswith("@")}
    return Selector(pats), nodes, {k: rec[k] for k in extra or {}}


def _faults(doc: Doc, node: yaml.Node, what: str) -> tuple[tuple[str, str], ...]:
    fault = one_of(synthetic.FAULTS)
    return tuple((key, fault(doc, vnode, f"{what}.{key}")) for key, _, vnode in doc.mapping(node, what))


SYNTHETIC_FIELDS: dict[str, Field] = {
    "model": Field(one_of(synthetic.MODELS), "model architecture", required=False),
    "size": Field(one_of(synthetic.SIZES), "cpu_tiny (CPU paths only), gpu_tiny (GPU kernels), block_tiny",
                  required=False),
    "form": Field(one_of(synthetic.FORMS), "config.json quantization_config or legacy hf_quant_config.json",
                  required=False),
    "input_activations": Field(one_of(synthetic.INPUT_ACTIVATIONS), "shape of every group's "
                               "input_activations (default: what the scheme implies)", required=False),
    "config_groups": Field(one_of(synthetic.CONFIG_GROUPS), "present, empty or missing", required=False),
    "quant_algo": Field(as_text, "ModelOpt quant_algo override, e.g. W4A16_NVFP4", required=False),
    "zero_point_order": Field(one_of(synthetic.ZERO_POINT_ORDERS), "AWQ: pack the zero points in AWQ's own order "
                              "or GPTQ's sequential one (a malformed export)", required=False),
    "quantize": Field(one_of(synthetic.QUANTIZE), "which modules are quantized", required=False),
    "seed": Field(lambda d, n, w: d.typed(n, w, (int,), "an integer"), "seed of the family's bf16 weights",
                  required=False),
    "input_scales": Field(one_of(synthetic.INPUT_SCALES), "input-scale tensors written regardless of the "
                          "config: auto (what the scheme implies), present or absent", required=False),
    "omit_tensors": Field(list_of(as_text), "globs of tensors to leave out (e.g. one expert's input_scale)",
                          required=False),
    "corrupt_tensors": Field(_faults, "glob -> fault (zero, inf, nan, shape, dtype)", required=False),
}


def _synthetic(doc: Doc, node: yaml.Node, what: str) -> dict[str, Any]:
    rec = doc.record(node, what, SYNTHETIC_FIELDS)
    return {k: v for k, v in rec.items() if not k.startswith("@") and v is not None}


def source(doc: Doc, node: yaml.Node, what: str) -> Source:
    rec = doc.record(node, what, {
        "synthetic": Field(_synthetic, "a synthetic checkpoint spec", required=False),
        "path": Field(as_text, "a local checkpoint directory (in the matrix's repository)", required=False),
        "hub": Field(as_text, "a hub id, resolved from the local HF cache only", required=False),
        "revision": Field(as_text, "hub revision (branch, tag or commit)", required=False),
    })
    kinds = [k for k in ("synthetic", "path", "hub") if rec[k] is not None]
    if len(kinds) != 1:
        raise doc.error(node, f"{what}: expected exactly one of synthetic, path, hub; got "
                              f"{', '.join(kinds) or 'none'}")
    kind = kinds[0]
    if rec["revision"] is not None and kind != "hub":
        raise doc.error(rec["@revision"], f"{what}.revision: only a hub source has a revision")
    value: Any = rec[kind]
    if kind == "path":
        value = doc.local_path(rec["@path"], f"{what}.path")
    elif kind == "hub":
        value = (value, rec["revision"] or "main")
        for bad, at in ((bad_hub_repo(value[0]), "@hub"), (bad_hub_revision(value[1]), "@revision")):
            if bad:
                raise doc.error(rec[at], f"{what}: {bad}")
    return Source(kind, value, doc.where(rec[f"@{kind}"]))


# Expectations a checkpoint (or its scheme) can state; each check reads its own keys.
def pattern(doc: Doc, node: yaml.Node, what: str) -> str:
    """A regular expression, compiled once here by RE2 (bounded.regex: linear-time matching, every compile error
    caught, an overflowing or deeply nested pattern included) so that a typo is a matrix error with its line."""
    text = as_text(doc, node, what)
    try:
        bounded.regex(text)
    except bounded.InputError as e:
        raise doc.error(node, f"{what}: {e.why}") from None
    return text


def finding_item(codes: tuple[str, ...]) -> Callable[[Doc, yaml.Node, str], str | TensorFinding]:
    """An expected finding: a code expected somewhere, or {code, tensor}: the code expected on the tensors the
    glob names (the lint's and the audit's expectations alike)."""
    fields = {"code": Field(one_of(codes), "the finding code"),
              "tensor": Field(as_text, "a glob over full tensor names where the finding must be")}

    def item(doc: Doc, node: yaml.Node, what: str) -> str | TensorFinding:
        if isinstance(node, yaml.MappingNode):
            rec = doc.record(node, what, fields)
            return TensorFinding(rec["code"], rec["tensor"])
        return one_of(codes)(doc, node, what)
    return item


def numerics_bounds(doc: Doc, node: yaml.Node, what: str) -> NumericsBounds:
    rec = doc.record(node, what, {
        "min_cosine": Field(fraction, "least cosine similarity of the layer's output with the reference"),
        "max_rel_error": Field(positive, "largest ||output - reference|| / ||reference||")})
    return NumericsBounds(rec["min_cosine"], rec["max_rel_error"])


EXPECT_FIELDS: dict[str, Field] = {
    "quant_method": Field(as_text, "the vLLM quantization method that must claim the checkpoint", required=False),
    "resolves_to": Field(one_of(RESOLUTIONS), "what config-level resolution must decide", required=False),
    "rejected_because": Field(pattern, "with resolves_to: rejected, a regular expression vLLM's refusal must "
                              "match (any other refusal, or a crash, is a failure)", required=False),
    "activation_scales": Field(lambda d, n, w: per_arch(d, n, w, one_of(ACTIVATION_SCALES)),
                               "whether the selected MoE backend must read input_scale: read, not_read or any "
                               "(a value, or per arch {sm90: any, '*': read})", required=False),
    "audit": Field(lambda d, n, w: per_arch(d, n, w, list_of(finding_item(AUDIT_FAILURES))), "what the post-load "
                   "audit must find in tensors the backend reads ([] = all loaded and usable): a kind anywhere, or "
                   "{code: kind, tensor: glob over checkpoint names}; or per arch",
                   required=False),
    "moe_backend": Field(lambda d, n, w: per_arch(d, n, w, list_of(as_text)),
                         "MoE backends acceptable, per arch ({sm100: [FLASHINFER_TRTLLM], '*': [...]})",
                         required=False),
    "lint": Field(list_of(finding_item(LINT_CODES)), "the checkpoint lint's findings ([] = clean): a code anywhere, or "
                  "{code, tensor} where the matrix names the tensor (each planted fault found where it is)",
                  required=False),
    "unquantized": Field(list_of(as_text), "MIXED_PRECISION: vLLM's linear modules outside the experts it must build "
                         "unquantized, every one (qkv_proj, o_proj, the router `gate`, lm_head); config_dispatch "
                         "fails on any other set", required=False),
    "dequant_strays": Field(as_bool, "true for an export whose files must decode to a model beyond "
                            "dequant_logits' bound (a layout fault no header shows)", required=False),
    "numerics": Field(numerics_bounds, "layer_numerics' bounds on vLLM's MoE output against the dequantized bf16 "
                      "reference: {min_cosine, max_rel_error}", required=False),
    **e2e.EXPECT_FIELDS,
}


def per_arch(doc: Doc, node: yaml.Node, what: str, item: Callable[[Doc, yaml.Node, str], Any]) -> PerArch:
    if isinstance(node, yaml.MappingNode):
        out = PerArch({key: item(doc, v, f"{what}.{key}") for key, _, v in doc.mapping(node, what)})
    else:
        out = PerArch({"*": item(doc, node, what)})
    out.where = {key: doc.where(k) for k, _ in node.value for key in [doc.scalar(k, what)]} \
        if isinstance(node, yaml.MappingNode) else {"*": doc.where(node)}
    return out


def expect(doc: Doc, node: yaml.Node, what: str) -> dict[str, Any]:
    rec = doc.record(node, what, EXPECT_FIELDS)
    return {k: v for k, v in rec.items() if not k.startswith("@") and v is not None}
