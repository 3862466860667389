"""``.portable/follow.json``: which content the user's copy and the serving worker last agreed
on, file by file, so a restarted server does not take the user's files for edits; and which
of those files this copy received from the worker, the only ones a deletion on the worker may
remove here.

``{"allocation_id": "...", "agreed": {"path": "hash", ...}, "received": {"path": "hash", ...}}``;
it holds for that allocation only. An unreadable file reads as empty: the follower then
compares with the version the worker started from, which can only make it keep more (a
conflict copy, a file the worker deleted), never lose an edit.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_portable.workdir.workcopy import FOLLOW_NAME as NAME
from jupyter_portable.workdir.workcopy import WorkspaceCopy


def _read(copy: WorkspaceCopy, allocation_id: str, key: str) -> dict[str, str]:
    try:
        obj: Any = json.loads(copy.follow_bytes() or b"{}")
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(obj, dict) or obj.get("allocation_id") != allocation_id:
        return {}
    if not isinstance(obj.get(key), dict):
        return {}
    return {k: v for k, v in obj[key].items() if isinstance(k, str) and isinstance(v, str)}


def read_agreed(copy: WorkspaceCopy, allocation_id: str) -> dict[str, str]:
    """What was agreed with ``allocation_id``'s worker (empty for any other allocation)."""
    return _read(copy, allocation_id, "agreed")


def read_received(copy: WorkspaceCopy, allocation_id: str) -> dict[str, str]:
    """The files this copy received from ``allocation_id``'s worker: path -> the hash of the bytes written."""
    return _read(copy, allocation_id, "received")


def write_agreed(copy: WorkspaceCopy, allocation_id: str, agreed: dict[str, str],
                 received: dict[str, str] | None = None) -> None:
    copy.write_follow(json.dumps({"allocation_id": allocation_id, "agreed": agreed,
                                  "received": received or {}}, sort_keys=True).encode())


__all__ = ["NAME", "read_agreed", "read_received", "write_agreed"]
