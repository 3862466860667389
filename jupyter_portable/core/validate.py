"""One validator set for what is read from disk, the network or a request: each check
returns the value it accepted or raises ManifestError (or the ``error`` it is given) with a
one-line reason that names the field and what it must be.

``loads_strict`` is the one JSON reader for records: it refuses duplicate keys, ``NaN``,
``Infinity`` and numbers too large for a float, and nesting deeper than Python can
follow. ``dumps_strict`` is its writing half: it refuses non-finite numbers.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

from jupyter_portable.core.errors import ManifestError
from jupyter_portable.core.times import parse_iso

HASH_RE = re.compile(r"\A[0-9a-f]{64}\Z")
_WSID_RE = re.compile(r"\A[a-z0-9][a-z0-9-]{2,63}\Z")
# Text a person typed for a setting or a label: no control characters (they hide in logs and UIs).
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
# What a terminal acts on: C0 controls (ESC starts its escapes), DEL and C1 controls (U+009B is a CSI).
_TERMINAL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_TERMINAL_LINE_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")

# What os.utime(ns=...) accepts where time_t is 64 bits: whole seconds within a signed int64.
MTIME_NS_MIN = -(2**63) * 10**9
MTIME_NS_MAX = 2**63 * 10**9 - 1
MAX_JSON_DEPTH = 64  # records nest a few levels; anything deeper is hostile
# An allocation id or route id: printable, no spaces, so it is safe in logs and paths.
_TOKEN_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}\Z")


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


def short_repr(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages (a hostile value can be huge)."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit
        return "a number too long to show"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_int(value: object, what: str, *, minimum: int = 0, maximum: int | None = None,
              error: type[Exception] = ManifestError) -> int:
    """An integer (never a bool or a float) within ``minimum``..``maximum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{what} must be an integer, got {short_repr(value)}")
    if value < minimum:
        raise error(f"{what} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise error(f"{what} must be <= {maximum}, got {value}")
    return value


def check_number(value: object, what: str, *, minimum: float | None = None, maximum: float | None = None,
                 above: float | None = None, error: type[Exception] = ManifestError) -> float:
    """A finite number (int or float, never a bool) within the bounds; ``above`` is exclusive."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{what} must be a number, got {short_repr(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        raise error(f"{what} is too large: {short_repr(value)}") from None
    if not math.isfinite(number):
        raise error(f"{what} must be a finite number, got {value!r}")
    if above is not None and not number > above:
        raise error(f"{what} must be more than {above:g}, got {number:g}")
    if minimum is not None and number < minimum:
        raise error(f"{what} must be at least {minimum:g}, got {number:g}")
    if maximum is not None and number > maximum:
        raise error(f"{what} must be at most {maximum:g}, got {number:g}")
    return number


def check_str(value: object, what: str, *, max_len: int | None = None, min_len: int = 0,
              printable: bool = False, error: type[Exception] = ManifestError) -> str:
    """A string of ``min_len``..``max_len`` characters; ``printable`` refuses control characters."""
    if not isinstance(value, str):
        raise error(f"{what} must be a string, got {short_repr(value)}")
    if len(value) < min_len:
        raise error(f"{what} must not be empty" if min_len == 1 else
                    f"{what} must have at least {min_len} characters")
    if max_len is not None and len(value) > max_len:
        raise error(f"{what} must be at most {max_len} characters, got {len(value)}")
    if printable and _CONTROL_RE.search(value):
        raise error(f"{what} must not contain control characters, got {short_repr(value)}")
    return value


def check_message(value: object, what: str = "the snapshot message", *,
                  error: type[Exception] = ManifestError) -> str:
    """A note a person wrote (a snapshot's message): text with no character a terminal acts on
    (escape sequences, carriage returns, C1 controls); newlines and tabs are kept."""
    if not isinstance(value, str):
        raise error(f"{what} must be text, got {type(value).__name__}")
    found = _TERMINAL_RE.search(value)
    if found:
        raise error(f"{what} holds the control character {found.group()!r} (terminals act on it); "
                    f"write it without: {short_repr(value)}")
    return value


def terminal_safe(text: str, *, one_line: bool = False) -> str:
    """``text`` to print: every character a terminal acts on written as its escape (``\\x1b``);
    with ``one_line`` newlines and tabs too, so a field cannot fake the lines around it."""
    pattern = _TERMINAL_LINE_RE if one_line else _TERMINAL_RE
    return pattern.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def check_str_list(value: object, what: str, *, max_items: int, max_len: int,
                   error: type[Exception] = ManifestError) -> list[str]:
    """A list of at most ``max_items`` non-empty printable strings of at most ``max_len`` characters."""
    if not isinstance(value, list):
        raise error(f"{what} must be a list of strings, got {short_repr(value)}")
    if len(value) > max_items:
        raise error(f"{what} must have at most {max_items} items, got {len(value)}")
    return [check_str(v, f"each of {what}", max_len=max_len, min_len=1, printable=True, error=error)
            for v in value]


def check_keys(obj: object, what: str, required: Iterable[str], optional: Iterable[str] = ()) -> dict:
    if not isinstance(obj, dict):
        raise ManifestError(f"{what} must be a JSON object")
    req = set(required)
    missing = req - obj.keys()
    if missing:
        raise ManifestError(f"{what} lacks {', '.join(sorted(missing))}")
    extra = obj.keys() - req - set(optional)
    if extra:
        raise ManifestError(f"{what} has unknown field(s) {', '.join(sorted(map(str, extra)))}")
    return obj


def check_text(value: object, what: str, *, max_len: int, optional: bool = True,
               error: type[Exception] = ManifestError) -> str | None:
    """A reason or note: a string that is not blank, of at most ``max_len`` characters; None where
    ``optional`` lets it be null."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > max_len:
        raise error(f"{what} must be a non-empty string of at most {max_len} characters")
    return value


def check_token(value: object, what: str, *, error: type[Exception] = ManifestError) -> str | None:
    """An id (an allocation's, a route's) or None: printable, no spaces, no ``..``, at most 200
    characters, so it is safe in logs and paths."""
    if value is None:
        return None
    if not isinstance(value, str) or not _TOKEN_RE.match(value) or ".." in value:
        raise error(f"{what} {short_repr(value)} is not a valid id")
    return value


def check_at(value: object, what: str = "time", *, error: type[Exception] = ManifestError) -> str:
    """An ISO 8601 time with its zone ("Z" or an offset): naive times are ambiguous across machines."""
    parse_iso(value, what, error=error)
    return value  # type: ignore[return-value]  # parse_iso checked it is a str


def plain_json(value: object, what: str, *, max_depth: int = 16, error: type[Exception] = ManifestError,
               _depth: int = 0) -> Any:
    """A copy of ``value`` if it is plain JSON: finite numbers, string keys, at most ``max_depth`` deep."""
    if _depth > max_depth:
        raise error(f"{what} is nested too deeply")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise error(f"{what} holds a non-finite number")
        return value
    if isinstance(value, (list, tuple)):
        return [plain_json(v, what, max_depth=max_depth, error=error, _depth=_depth + 1) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise error(f"{what} has a non-string key")
        return {k: plain_json(v, what, max_depth=max_depth, error=error, _depth=_depth + 1) for k, v in value.items()}
    raise error(f"{what} holds a {type(value).__name__}, which is not JSON")


def plain_json_object(value: object, what: str, *, max_depth: int = 16,
                      error: type[Exception] = ManifestError) -> dict[str, Any]:
    """:func:`plain_json` of a JSON object."""
    copied = plain_json(value, what, max_depth=max_depth, error=error)
    if not isinstance(copied, dict):
        raise error(f"{what} must be a JSON object")
    return copied


class _Refused(Exception):
    """Raised inside the JSON decoder's hooks; turned into the caller's error below."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"has the key {key!r} twice")
        out[key] = value
    return out


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"holds the number {text[:40]}, too large for a float")
    return value


def _no_constant(name: str) -> Any:
    raise _Refused(f"holds {name}, which is not JSON")


def _too_deep(value: Any, limit: int) -> bool:
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return False


def utf8_text(data: bytes | bytearray) -> str:
    """``data`` as UTF-8 text without a byte-order mark; ValueError otherwise (a record is
    UTF-8 only, while ``json.loads`` of bytes also takes UTF-16, UTF-32 and a BOM)."""
    if data[:3] == b"\xef\xbb\xbf":
        raise ValueError("it starts with a byte-order mark; records are plain UTF-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"it is not UTF-8 (byte {exc.start}); records are UTF-8") from None


def loads_strict(data: bytes | str, what: str, *, error: type[Exception] = ManifestError,
                 max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``data`` parsed as strict JSON; ``error`` naming ``what`` when it is not.

    Refused: anything but UTF-8 (a byte-order mark, UTF-16 or UTF-32, which Python's JSON
    reader would take), invalid JSON, a key twice in one object (readers disagree on which
    wins), NaN/Infinity and overflowing numbers, and nesting deeper than ``max_depth``."""
    try:
        if isinstance(data, (bytes, bytearray)):
            data = utf8_text(data)
        value = json.loads(data, object_pairs_hook=_no_duplicates, parse_float=_finite_float,
                           parse_constant=_no_constant)
    except _Refused as exc:
        raise error(f"{what} {exc}") from None
    except RecursionError:
        raise error(f"{what} is not valid JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{what} is not valid JSON: {str(exc)[:200]}") from None
    if _too_deep(value, max_depth):
        raise error(f"{what} is not valid JSON here: nested more than {max_depth} levels deep")
    return value


def dumps_strict(obj: Any, what: str, *, error: type[Exception] = ManifestError, **kwargs: Any) -> str:
    """``obj`` as JSON text, refusing NaN and Infinity (which no other JSON reader accepts)."""
    try:
        return json.dumps(obj, allow_nan=False, **kwargs)
    except (ValueError, TypeError, RecursionError) as exc:
        raise error(f"{what} cannot be written as JSON: {str(exc)[:200]}") from None


__all__ = ["HASH_RE", "MAX_JSON_DEPTH", "MTIME_NS_MAX", "MTIME_NS_MIN", "check_at", "check_hash", "check_int",
           "check_keys", "check_text", "check_token", "plain_json", "plain_json_object",
           "check_message", "check_number", "check_str", "check_str_list", "check_workspace_id", "dumps_strict",
           "loads_strict", "short_repr", "terminal_safe", "utf8_text"]
