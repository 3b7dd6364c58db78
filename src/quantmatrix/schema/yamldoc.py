"""Validated YAML: files composed into nodes (safe tags only, nothing constructed) and converted node by node,
so every error names file:line:column, the key, what was expected and, for a misspelt key, the closest one."""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from quantmatrix.errors import MatrixError

_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
# What a matrix may set for the engine child: the CUDA, PyTorch, vLLM and quantmatrix knobs the modes need. A matrix
# is data, never code: LD_PRELOAD, PYTHONPATH, BASH_ENV and the like would run what the matrix names in the child.
ENV_PREFIXES = ("CUDA_", "PYTORCH_", "TORCH_", "VLLM_", "QUANTMATRIX_", "NCCL_")
ENV_CHARS = 32_768  # one environment value (Linux refuses more than 128 KiB per string at exec)
_SURROGATE = re.compile("[\ud800-\udfff]")


def closest(word: str, options: Iterable[str]) -> str:
    hit = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {hit[0]!r}?)" if hit else ""


# A matrix is data: what would make it run code, or read files outside its own repository, needs this flag.
TRUST_FLAG = "--trust-matrix"


def repository(path: Path) -> Path:
    """The repository a matrix file belongs to: the nearest directory above it holding `.git` (a checkout or a
    worktree), else the file's own directory."""
    here = path.resolve().parent
    return next((d for d in (here, *here.parents) if (d / ".git").exists()), here)


class Doc:
    """One YAML file being validated: turns nodes into values, errors into file:line:column messages. `trusted`
    (TRUST_FLAG) lets it name files outside its repository and set trust_remote_code."""

    def __init__(self, path: Path, trusted: bool = False) -> None:
        self.path = path
        self.trusted = trusted
        self._constructor = yaml.constructor.SafeConstructor()

    def local_path(self, node: yaml.Node, what: str) -> Path:
        """A path relative to the file, inside its repository unless trusted."""
        path = (self.path.parent / as_text(self, node, what)).resolve()
        root = repository(self.path)
        if not self.trusted and not path.is_relative_to(root):
            raise self.error(node, f"{what}: {node.value!r} is {path}, outside the matrix's repository {root}; a "
                                   f"matrix names files inside its own repository ({TRUST_FLAG} allows others)")
        return path

    def where(self, node: yaml.Node) -> str:
        m = node.start_mark
        return f"{self.path}:{m.line + 1}:{m.column + 1}"

    def error(self, node: yaml.Node, message: str) -> MatrixError:
        return MatrixError(f"{self.where(node)}: {message}")

    def scalar(self, node: yaml.Node, what: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, f"{what}: expected a single value, got {kind(node)}")
        try:
            value = self._constructor.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as e:
            raise self.error(node, f"{what}: {e.problem}") from None
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:
            # a tag or implicit type YAML resolves and then cannot build: `!!int x`, `2027-02-30`, 5,000 digits
            tag = node.tag.rsplit(":", 1)[-1]
            raise self.error(node, f"{what}: {node.value[:60]!r} is not a valid {tag} ({str(e)[:120]})") from None
        if isinstance(value, str) and _SURROGATE.search(value):
            raise self.error(node, f"{what}: the text holds a lone surrogate escape, which no file or terminal "
                                   "can show")
        return value

    def typed(self, node: yaml.Node, what: str, types: tuple[type, ...], expected: str) -> Any:
        value = self.scalar(node, what)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise self.error(node, f"{what}: expected {expected}, got {show(value)}")
        return value

    def mapping(self, node: yaml.Node, what: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        """The (key, key node, value node) triples of a mapping; duplicate keys are an error."""
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, f"{what}: expected a mapping, got {kind(node)}")
        seen: dict[str, yaml.Node] = {}
        out = []
        for knode, vnode in node.value:
            key = self.scalar(knode, f"{what} key")
            if not isinstance(key, str):
                raise self.error(knode, f"{what}: keys must be strings, got {show(key)}")
            if key in seen:
                raise self.error(knode, f"{what}: duplicate key {key!r} (first at line "
                                        f"{seen[key].start_mark.line + 1})")
            seen[key] = knode
            out.append((key, knode, vnode))
        return out

    def sequence(self, node: yaml.Node, what: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(node, f"{what}: expected a list, got {kind(node)}")
        return list(node.value)

    def record(self, node: yaml.Node, what: str, fields: Mapping[str, Field]) -> dict[str, Any]:
        """Validate a mapping against `fields`: unknown keys, missing keys and wrong types are errors."""
        out: dict[str, Any] = {}
        for key, knode, vnode in self.mapping(node, what):
            field = fields.get(key)
            if field is None:
                raise self.error(knode, f"{what}: unknown key {key!r}{closest(key, fields)}; "
                                        f"expected one of: {', '.join(fields)}")
            out[key] = field.convert(self, vnode, f"{what}.{key}")
            out[f"@{key}"] = vnode
        for key, field in fields.items():
            if key not in out:
                if field.required:
                    raise self.error(node, f"{what}: missing required key {key!r} ({field.help})")
                out[key] = field.default() if callable(field.default) else field.default
        return out


@dataclasses.dataclass(frozen=True)
class Field:
    convert: Callable[[Doc, yaml.Node, str], Any]
    help: str
    required: bool = True
    default: Any = None


def kind(node: yaml.Node) -> str:
    return {yaml.MappingNode: "a mapping", yaml.SequenceNode: "a list"}.get(type(node), "a single value")


def show(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def as_text(doc: Doc, node: yaml.Node, what: str) -> str:
    return doc.typed(node, what, (str,), "a string")


def matching(regex: re.Pattern[str], expected: str) -> Callable[[Doc, yaml.Node, str], str]:
    def convert(doc: Doc, node: yaml.Node, what: str) -> str:
        value = as_text(doc, node, what)
        if not regex.match(value):
            raise doc.error(node, f"{what}: {value!r} is not {expected}")
        return value
    return convert


def as_bool(doc: Doc, node: yaml.Node, what: str) -> bool:
    return doc.typed(node, what, (bool,), "true or false")


def one_of(options: Iterable[str]) -> Callable[[Doc, yaml.Node, str], str]:
    opts = tuple(options)

    def convert(doc: Doc, node: yaml.Node, what: str) -> str:
        value = doc.scalar(node, what)
        # by type too: `True == 1` and `1.0 == 1` in Python, and neither is the schema version 1
        if not any(type(value) is type(o) and value == o for o in opts):
            hint = closest(value, [str(o) for o in opts]) if isinstance(value, str) else ""
            raise doc.error(node, f"{what}: expected one of {', '.join(map(str, opts))}; got {value!r}{hint}")
        return value
    return convert


def list_of(item: Callable[[Doc, yaml.Node, str], Any]) -> Callable[[Doc, yaml.Node, str], tuple]:
    def convert(doc: Doc, node: yaml.Node, what: str) -> tuple:
        return tuple(item(doc, n, f"{what}[{i}]") for i, n in enumerate(doc.sequence(node, what)))
    return convert


def env_vars(doc: Doc, node: yaml.Node, what: str) -> dict[str, str]:
    out = {}
    for key, knode, vnode in doc.mapping(node, what):
        if not _ENV.match(key):
            raise doc.error(knode, f"{what}: {key[:80]!r} is not an environment variable name (letters, digits and _, "
                                   "at most 128)")
        if not key.startswith(ENV_PREFIXES):
            raise doc.error(knode, f"{what}: {key!r} is not a variable a matrix may set for the engine (only "
                                   f"{', '.join(p + '*' for p in ENV_PREFIXES)}: a matrix is data, not code)")
        value = doc.scalar(vnode, f"{what}.{key}")
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise doc.error(vnode, f"{what}.{key}: environment values are strings (quote them), got {show(value)}")
        value = str(value)
        if "\x00" in value or len(value) > ENV_CHARS:
            raise doc.error(vnode, f"{what}.{key}: an environment value holds no NUL and at most {ENV_CHARS} "
                                   f"characters (got {len(value)}{', a NUL' if chr(0) in value else ''})")
        out[key] = value
    return out


def int_at_least(low: int) -> Callable[[Doc, yaml.Node, str], int]:
    def convert(doc: Doc, node: yaml.Node, what: str) -> int:
        value = doc.typed(node, what, (int,), "an integer")
        if value < low:
            raise doc.error(node, f"{what}: expected an integer >= {low}, got {value}")
        return value
    return convert


def positive(doc: Doc, node: yaml.Node, what: str) -> float:
    value = doc.typed(node, what, (int, float), "a number")
    if not value > 0:  # also refuses .nan
        raise doc.error(node, f"{what}: expected a positive number, got {value}")
    return float(value)


def fraction(doc: Doc, node: yaml.Node, what: str) -> float:
    value = doc.typed(node, what, (int, float), "a number")
    if not 0 <= value <= 1:
        raise doc.error(node, f"{what}: expected a fraction between 0 and 1, got {value}")
    return float(value)


def scalar_map(doc: Doc, node: yaml.Node, what: str) -> dict[str, Any]:
    return {key: doc.scalar(vnode, f"{what}.{key}") for key, _, vnode in doc.mapping(node, what)}


def engine_arguments(doc: Doc, node: yaml.Node, what: str) -> dict[str, Any]:
    """vLLM engine arguments; trust_remote_code (a checkpoint's own Python, run in the engine) only when trusted."""
    args = scalar_map(doc, node, what)
    if args.get("trust_remote_code") and not doc.trusted:
        at = next(k for key, k, _ in doc.mapping(node, what) if key == "trust_remote_code")
        raise doc.error(at, f"{what}.trust_remote_code: a matrix is data, and this runs the checkpoint's own Python "
                            f"in the engine ({TRUST_FLAG} allows it)")
    return args


def as_date(doc: Doc, node: yaml.Node, what: str) -> datetime.date:
    value = doc.scalar(node, what)
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value
    raise doc.error(node, f"{what}: expected a date YYYY-MM-DD, got {show(value)}")
