"""``.portable/follow.json``: which content the user's copy and the serving worker last agreed
on, file by file, so a restarted server does not take the user's files for edits.

``{"allocation_id": "...", "agreed": {"path": "hash", ...}}``; it holds for that allocation
only. An unreadable file reads as empty: the follower then compares with the version the
worker started from, which can only make it keep more (a conflict copy), never lose an edit.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_portable.workdir.files import atomic_write
from jupyter_portable.workdir.workcopy import WorkspaceCopy

NAME = "follow.json"


def read_agreed(copy: WorkspaceCopy, allocation_id: str) -> dict[str, str]:
    """What was agreed with ``allocation_id``'s worker (empty for any other allocation)."""
    try:
        obj: Any = json.loads((copy.meta / NAME).read_bytes())
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(obj, dict) or obj.get("allocation_id") != allocation_id:
        return {}
    if not isinstance(obj.get("agreed"), dict):
        return {}
    return {k: v for k, v in obj["agreed"].items() if isinstance(k, str) and isinstance(v, str)}


def write_agreed(copy: WorkspaceCopy, allocation_id: str, agreed: dict[str, str]) -> None:
    atomic_write(copy.meta / NAME, json.dumps({"allocation_id": allocation_id, "agreed": agreed},
                                               sort_keys=True).encode())


__all__ = ["NAME", "read_agreed", "write_agreed"]
