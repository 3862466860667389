"""What the kernel records between snapshots: the next action (last cell, user's note).

Kept in ``.portable/next_action.json`` and put into the manifest at the next snapshot.
Only where the work stands is recorded (notebook, cell id, count, state, the user's own
note), never cell source, which may hold secrets.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jupyter_portable.core.errors import ManifestError
from jupyter_portable.core.records import check_next_action
from jupyter_portable.core.times import now_iso
from jupyter_portable.workdir.workcopy import WorkspaceCopy


def read_next_action(copy: WorkspaceCopy) -> dict[str, Any] | None:
    try:
        obj = json.loads(copy.next_action_bytes() or b"null")
        return check_next_action(obj)
    except (OSError, ValueError, ManifestError, RecursionError):
        return None


def update_next_action(copy: WorkspaceCopy, **fields: Any) -> dict[str, Any]:
    current = read_next_action(copy) or {}
    current.update({k: v for k, v in fields.items()})
    current = {k: v for k, v in current.items() if v is not None}
    current["updated"] = now_iso()
    check_next_action(current)
    copy.write_next_action(json.dumps(current).encode())
    return current


def notebook_path() -> str | None:
    """The notebook this kernel serves, as jupyter_server tells kernels it starts."""
    return os.environ.get("JPY_SESSION_NAME") or None
