"""Workspace-relative paths: the one check every manifest and request path passes."""

from __future__ import annotations

import posixpath

from jupyter_portable.core.errors import UnsafePath

# the one top-level name no workspace file may have: the copy's own folder (workdir/ owns what is in it)
RESERVED_TOP = ".portable"


def in_reserved(path: str) -> bool:
    """Whether the workspace-relative ``path`` is the copy's own folder or inside it."""
    return path.split("/")[0] == RESERVED_TOP


def disk_name(text: str) -> bytes:
    """The bytes a path or name is on disk: UTF-8, with each ``\\udc80``-``\\udcff`` escape
    (Python's ``surrogateescape``) back as its byte. Two names with the same bytes are the same
    file; UnicodeEncodeError for a lone surrogate, which no filesystem name can hold."""
    return text.encode("utf-8", "surrogateescape")


def check_encodable(text: str, what: str) -> None:
    """Refuse a name no filesystem can hold: a lone surrogate that is not an escaped byte."""
    if not text.isascii():
        try:
            disk_name(text)
        except UnicodeEncodeError as exc:
            bad = text[exc.start]
            raise UnsafePath(f"{what} {text!r} holds a lone surrogate (U+{ord(bad):04X}), which is neither "
                             "UTF-8 nor an escaped byte: no filesystem name can hold it") from None


def check_relpath(path: object, *, what: str = "path") -> str:
    """Return ``path`` if it is a safe, normalised, workspace-relative POSIX path.

    Refused: non-strings, empty, NUL or backslash, absolute paths, ``.``/``..``
    segments, empty segments, and anything inside the workspace's ``.portable``.
    """
    if not isinstance(path, str):
        raise UnsafePath(f"{what} must be a string, got {type(path).__name__}")
    if not path:
        raise UnsafePath(f"{what} is empty")
    if "\x00" in path:
        raise UnsafePath(f"{what} {path!r} contains a NUL byte")
    if "\\" in path:
        raise UnsafePath(f"{what} {path!r} contains a backslash")
    if path.startswith("/"):
        raise UnsafePath(f"{what} {path!r} is absolute")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise UnsafePath(f"{what} {path!r} has a {part or 'empty'!r} segment")
    if parts[0] == RESERVED_TOP:
        raise UnsafePath(f"{what} {path!r} is inside the reserved .portable directory")
    check_encodable(path, what)
    return path


def check_link_target(path: str, target: object) -> str:
    """Return a symlink's ``target`` if, resolved from ``path``, it stays inside the workspace."""
    if not isinstance(target, str) or not target:
        raise UnsafePath(f"symlink {path!r} has no target")
    if "\x00" in target or "\\" in target:
        raise UnsafePath(f"symlink {path!r} target contains a NUL byte or a backslash")
    if target.startswith("/"):
        raise UnsafePath(f"symlink {path!r} points to absolute path {target!r}")
    check_encodable(target, f"the target of symlink {path!r}:")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if resolved == ".." or resolved.startswith("../") or resolved == ".":
        raise UnsafePath(f"symlink {path!r} points outside the workspace ({target!r})")
    if in_reserved(resolved):
        raise UnsafePath(f"symlink {path!r} points into .portable")
    return target
