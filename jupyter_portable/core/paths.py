"""Workspace-relative paths: the one check every manifest and request path passes."""

from __future__ import annotations

import posixpath

from jupyter_portable.core.errors import UnsafePath

_RESERVED_TOP = ".portable"


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
    if parts[0] == _RESERVED_TOP:
        raise UnsafePath(f"{what} {path!r} is inside the reserved .portable directory")
    return path


def check_link_target(path: str, target: object) -> str:
    """Return a symlink's ``target`` if, resolved from ``path``, it stays inside the workspace."""
    if not isinstance(target, str) or not target:
        raise UnsafePath(f"symlink {path!r} has no target")
    if "\x00" in target or "\\" in target:
        raise UnsafePath(f"symlink {path!r} target contains a NUL byte or a backslash")
    if target.startswith("/"):
        raise UnsafePath(f"symlink {path!r} points to absolute path {target!r}")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if resolved == ".." or resolved.startswith("../") or resolved == ".":
        raise UnsafePath(f"symlink {path!r} points outside the workspace ({target!r})")
    if resolved.split("/")[0] == _RESERVED_TOP:
        raise UnsafePath(f"symlink {path!r} points into .portable")
    return target
