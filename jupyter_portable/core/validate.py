"""One validator set for what is read from disk, the network or a request: each check
returns the value it accepted or raises ManifestError with a one-line reason that names
the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from jupyter_portable.core.errors import ManifestError

HASH_RE = re.compile(r"\A[0-9a-f]{64}\Z")
_WSID_RE = re.compile(r"\A[a-z0-9][a-z0-9-]{2,63}\Z")


def check_hash(value: object, what: str = "hash") -> str:
    if not isinstance(value, str) or not HASH_RE.match(value):
        raise ManifestError(f"{what} {value!r} is not a 64-digit lowercase hex BLAKE3 hash")
    return value


def check_workspace_id(value: object) -> str:
    if not isinstance(value, str) or not _WSID_RE.match(value):
        raise ManifestError(
            f"workspace id {value!r} is not valid (lowercase letters, digits and '-', 3-64 chars)"
        )
    return value


def check_int(value: object, what: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ManifestError(f"{what} must be an integer, got {value!r}")
    if value < minimum:
        raise ManifestError(f"{what} must be >= {minimum}, got {value}")
    return value


def check_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ManifestError(f"{what} must be a string, got {value!r}")
    return value


def check_keys(obj: object, what: str, required: Iterable[str], optional: Iterable[str] = ()) -> dict:
    if not isinstance(obj, dict):
        raise ManifestError(f"{what} must be a JSON object")
    req = set(required)
    missing = req - obj.keys()
    if missing:
        raise ManifestError(f"{what} lacks {', '.join(sorted(missing))}")
    extra = obj.keys() - req - set(optional)
    if extra:
        raise ManifestError(f"{what} has unknown field(s) {', '.join(sorted(extra))}")
    return obj
