"""Edits made on both sides: a file saved in JupyterLab that the worker had changed too.

The worker's version wins and the user's is kept beside it; each such case is recorded in
``.portable/conflicts.json`` so that a restarted server still shows it (the newest
``KEEP`` of them).
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_portable.workdir.workcopy import WorkspaceCopy

KEEP = 100  # a conflict is listed until a later save of its file reaches the worker (resolve_conflicts)


def read_conflicts(copy: WorkspaceCopy) -> list[dict[str, Any]]:
    """The recorded conflicts, oldest first; an unreadable file reads as none (it is only a log)."""
    try:
        obj = json.loads(copy.conflicts_bytes() or b"[]")
    except (OSError, ValueError, RecursionError):
        return []
    if not isinstance(obj, list):
        return []
    return [c for c in obj if isinstance(c, dict) and isinstance(c.get("path"), str)][-KEEP:]


def resolve_conflicts(copy: WorkspaceCopy, path: str) -> bool:
    """``path`` is the same on both sides again (a later save of it was forwarded): its conflicts
    are resolved and no longer listed. True when there were any."""
    if not any(c["path"] == path for c in read_conflicts(copy)):
        return False
    with copy.conflicts_lock():
        entries = [c for c in read_conflicts(copy) if c["path"] != path]
        copy.write_conflicts(json.dumps(entries, allow_nan=False).encode())
    return True


def add_conflict(copy: WorkspaceCopy, path: str, at: str, kept: str) -> list[dict[str, Any]]:
    """Record that ``path`` conflicted at ``at`` and the user's version was kept as ``kept``; two
    writers at once (the server's monitor and its follow loop) each add theirs."""
    with copy.conflicts_lock():
        entries = [*read_conflicts(copy), {"path": path, "at": at, "kept": kept}][-KEEP:]
        copy.write_conflicts(json.dumps(entries, allow_nan=False).encode())
    return entries
