"""What never leaves a runner in a bundle: tokens (Hugging Face, GitHub, cloud keys), anything a variable named
like a secret holds, and files that hold credentials (`.env`, the Hugging Face token file, .netrc). Everything a
bundle writes from a runner's text (environment dump, engine log, request, result) passes through `scrub`."""

from __future__ import annotations

import re
from pathlib import Path

REDACTED = "[redacted]"
_TOKENS = re.compile(
    r"\bhf_[A-Za-z0-9]{20,}\b"  # Hugging Face user access tokens
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}\b|\bgithub_pat_[A-Za-z0-9_]{20,}\b"  # GitHub tokens
    r"|\bAKIA[0-9A-Z]{16}\b|\bxox[abprs]-[A-Za-z0-9-]{10,}\b"  # AWS access key ids, Slack tokens
    r"|\bBearer\s+[A-Za-z0-9._~+/=-]{16,}")
# NAME=value or "name": "value" where the name ends in a word for a secret (HF_TOKEN, api_key; not max_tokens)
_NAMED = re.compile(r"""(?ix)
    (?P<name>["']?\b[\w.-]*(?:token|secret|passw(?:or)?d|api[_-]?key|access[_-]?key|credentials?|private[_-]?key)
              ["']?)
    (?P<sep>\s*[=:]\s*)
    (?P<value>"[^"\n]*"|'[^'\n]*'|[^\s,}\]]+)""")
# Files a bundle never copies, whatever directory they sit in.
SECRET_FILES = frozenset({".env", "token", "stored_tokens", ".netrc", ".git-credentials", ".pypirc",
                          "credentials", ".huggingface_token"})


def scrub(text: str) -> str:
    """The text with every token and every secret-named value replaced by [redacted]."""
    text = _NAMED.sub(lambda m: f"{m['name']}{m['sep']}{_quoted(m['value'])}", text)
    return _TOKENS.sub(REDACTED, text)


def _quoted(value: str) -> str:
    return f"{value[0]}{REDACTED}{value[0]}" if value[:1] in "\"'" and len(value) > 1 else REDACTED


def secret_file(path: Path) -> bool:
    return path.name in SECRET_FILES or path.name.startswith(".env.")
