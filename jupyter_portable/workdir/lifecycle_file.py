"""The lifecycle of a workspace copy, kept in ``.portable/lifecycle.json``.

The CLI and the server may both drive one workspace, so every change is a read-modify-write
under an exclusive ``flock`` on ``.portable/lifecycle.lock`` (``WorkspaceCopy.lifecycle_lock``), and the
file is replaced atomically: a reader never needs the lock, it sees the old record or the new one, whole.
A record that fails validation is refused, never replaced: the events are the history the
sidebar shows, and a restarted server decides from them whether to resume or roll back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from jupyter_portable.core.errors import ManifestError, StoreError
from jupyter_portable.core.lifecycle import Event, Lifecycle
from jupyter_portable.core.times import now_iso
from jupyter_portable.workdir.workcopy import LIFECYCLE_LOCK as LOCK_NAME
from jupyter_portable.workdir.workcopy import LIFECYCLE_NAME, WorkspaceCopy

_REPAIR_HINT = ("the file was left as it is: move it aside to start again from IDLE "
                "(the store's manifests stay the truth), or restore it from a backup")


def lifecycle_path(copy: WorkspaceCopy) -> Path:
    return copy.lifecycle_path


def _read(copy: WorkspaceCopy) -> Lifecycle:
    config = copy.read_config()
    workspace_id = config.workspace_id
    path = lifecycle_path(copy)
    try:
        data = copy.lifecycle_bytes()
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc}") from exc
    if data is None:
        # never written: the copy's own version and epoch are where the workspace stands
        return Lifecycle.new(workspace_id, at=now_iso(), version=config.version, epoch=config.epoch)
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as exc:  # RecursionError: hostile nesting
        raise ManifestError(f"{path} is not valid JSON: {str(exc)[:200]}", hint=_REPAIR_HINT) from exc
    try:
        lc = Lifecycle.from_json(obj)
    except ManifestError as exc:
        raise ManifestError(f"{path}: {exc}", hint=_REPAIR_HINT) from exc
    if lc.workspace_id != workspace_id:
        raise ManifestError(f"{path} belongs to workspace {lc.workspace_id}, this copy is {workspace_id}",
                            hint=_REPAIR_HINT)
    return lc


def load(copy: WorkspaceCopy) -> Lifecycle:
    """The copy's lifecycle; a bare IDLE one at the copy's version if none was written yet."""
    return _read(copy)


def update(copy: WorkspaceCopy, fn: Callable[[Lifecycle], Lifecycle], *, timeout_s: float = 30) -> Lifecycle:
    """Apply ``fn`` to the current lifecycle under the lock and store its result, which must
    only add events. ``fn`` should be quick and do no I/O: it holds every other writer up."""
    with copy.lifecycle_lock(timeout_s):
        current = _read(copy)
        new = fn(current)
        if not isinstance(new, Lifecycle):
            raise TypeError(f"update() expects fn to return a Lifecycle, got {type(new).__name__}")
        if new == current:
            return current
        if new.workspace_id != current.workspace_id or new.events[:len(current.events)] != current.events:
            raise ManifestError("a lifecycle update may only add events: history is never rewritten")
        body = new.to_json()
        Lifecycle.from_json(body)  # never write what a reader would refuse
        copy.write_lifecycle(json.dumps(body, indent=1).encode() + b"\n")
        return new


def events_since(copy: WorkspaceCopy, seq: int) -> list[Event]:
    """The events after ``seq``, oldest first (0 gives them all)."""
    return [ev for ev in _read(copy).events if ev.seq > seq]


__all__ = ["LIFECYCLE_NAME", "LOCK_NAME", "events_since", "lifecycle_path", "load", "update"]
