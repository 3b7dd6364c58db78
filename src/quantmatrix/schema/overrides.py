"""QUANTMATRIX_GUARD_BACKENDS: the file whose `moe_backends:` the production guard puts over the packaged read-sets.
It may hold only that key (a backends-only override) or be a whole matrix (validated as one). An entry that drops a
role the packaged read-set of the same backend names is refused: the packaged sets are what vLLM's own kernels read
(tests/test_observed_reads.py measures them), so `reads: []` would let the seed bug through."""

from __future__ import annotations

from pathlib import Path

import yaml

from quantmatrix import bounded
from quantmatrix.errors import MatrixError
from quantmatrix.schema import backends
from quantmatrix.schema.model import MoeBackend
from quantmatrix.schema.yamldoc import Doc, Field


def override_file(path: str | Path) -> dict[str, MoeBackend]:
    """The packaged read-sets with the file's moe_backends on top; any problem is a MatrixError at file:line."""
    path = Path(path)
    try:
        text = bounded.read_bytes(path, "matrix").decode("utf-8")
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except bounded.InputError as e:
        raise MatrixError(f"{path}: cannot read the guard's backends override: {e.why}") from None
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError) as e:
        raise MatrixError(f"{path}: not a YAML file of moe_backends: {bounded.shown(e, 200)}") from None
    doc = Doc(path)
    keys = {k.value for k, _ in root.value} if isinstance(root, yaml.MappingNode) else set()
    if keys == {"moe_backends"}:
        nodes = doc.record(root, "backends", {"moe_backends": Field(lambda d, n, w: tuple(d.sequence(n, w)),
                                                                    "MoE kernel backends and what they read")})
        nodes = nodes["moe_backends"]
    else:
        from quantmatrix.schema.load import load

        load(path, trusted=True)  # a whole matrix, validated as one (only its moe_backends are used here)
        nodes = tuple(next(v for k, v in root.value if k.value == "moe_backends").value) \
            if "moe_backends" in keys else ()
    parsed = backends.parse(doc, nodes)
    packaged = backends.package_backends()
    for node, (name, entry) in zip(nodes, parsed.items(), strict=True):
        own = packaged.get(name)
        if own is not None and not own.reads <= entry.reads:
            dropped = ", ".join(sorted(own.reads - entry.reads))
            raise doc.error(node, f"moe_backends: {name} drops {dropped}, which vLLM's own {name} kernels read "
                                  f"(the packaged read-set: {', '.join(sorted(own.reads))}); the guard would then "
                                  "pass a checkpoint that lacks them")
    return backends.merged(parsed)
