"""MoE kernel backends and the tensor roles each reads. The read-sets ship as package data
(quantmatrix/data/backends.yaml), so the production guard needs no matrix; a matrix's own `moe_backends:` replaces an
entry of the same name or adds one. The post-load audit and the guard both take their read-sets from here."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import yaml

from quantmatrix.errors import MatrixError
from quantmatrix.schema import limits
from quantmatrix.schema.model import MoeBackend
from quantmatrix.schema.vocab import ROLES
from quantmatrix.schema.yamldoc import Doc, Field, as_bool, as_text, list_of, one_of

PACKAGE_FILE = Path(__file__).resolve().parent.parent / "data" / "backends.yaml"


def parse(doc: Doc, nodes: tuple[yaml.Node, ...]) -> dict[str, MoeBackend]:
    """A `moe_backends:` list, validated entry by entry (file:line:column on any error)."""
    seen: dict[str, str] = {}
    backends: dict[str, MoeBackend] = {}
    for i, node in enumerate(nodes):
        r = doc.record(node, f"moe_backends[{i}]", {
            "name": Field(as_text, "vLLM's backend name, e.g. MARLIN"),
            "reads": Field(list_of(one_of(ROLES)), f"tensor roles the kernel reads: {', '.join(ROLES)}"),
            "single_input_scale": Field(as_bool, "takes one input_scale per layer (not per expert)",
                                        required=False, default=False),
            "kernel_alphas": Field(as_bool, "its fused-MoE quant config carries g1_alphas/g2_alphas (default true)",
                                   required=False, default=True),
            "override": Field(as_text, "the word vLLM's backend override (--moe-backend) forces it with "
                              "(layer_numerics forces each in turn); absent: vLLM offers none", required=False),
            "label": Field(limits.text_at_most(limits.LABEL_CHARS, "a label"), "what it is"),
        })
        if r["name"] in seen:
            raise doc.error(r["@name"], f"duplicate MoE backend {r['name']!r} (already defined at {seen[r['name']]})")
        seen[r["name"]] = doc.where(r["@name"])
        backends[r["name"]] = MoeBackend(r["name"], frozenset(r["reads"]), r["single_input_scale"], r["label"],
                                         r["kernel_alphas"], r["override"])
    return backends


@functools.cache
def package_backends() -> Mapping[str, MoeBackend]:
    """The read-sets shipped with quantmatrix (a broken package file is a MatrixError naming it)."""
    doc = Doc(PACKAGE_FILE)
    try:
        root = yaml.compose(PACKAGE_FILE.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError) as e:
        raise MatrixError(f"{PACKAGE_FILE}: cannot read the packaged backend read-sets: {e}") from None
    top = doc.record(root, "backends", {"moe_backends": Field(lambda d, n, w: tuple(d.sequence(n, w)),
                                                              "MoE kernel backends and what they read")})
    return dict(parse(doc, top["moe_backends"]))


def merged(overrides: Mapping[str, MoeBackend]) -> dict[str, MoeBackend]:
    """The packaged read-sets with a matrix's entries on top (same name: the matrix's wins)."""
    return {**package_backends(), **overrides}
