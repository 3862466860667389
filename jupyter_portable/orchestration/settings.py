"""The workspace's settings (requirements, budget, planned hours, auto-snapshot), a document
kept with the workspace in its store, so every copy and every machine sees the same one.

The record and its rules are ``core/settings``; this module reads and writes the document.
"""

from __future__ import annotations

from typing import Any

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.settings import DEFAULT_HOURS, FIELD_NAMES, Settings, apply_changes
from jupyter_portable.core.validate import dumps_strict
from jupyter_portable.engine.workspace import Workspace

_REPAIR = "set that field again with `jupyter portable settings` (or in the sidebar's settings)"


def load_settings(ws: Workspace) -> Settings:
    """The workspace's settings; a stored document that breaks the rules is a UsageError saying which field."""
    try:
        return Settings.from_json(ws.store.read_doc(ws.workspace_id, "settings"))
    except UsageError as exc:
        raise UsageError(f"the workspace settings in the store are not valid: {exc}", hint=_REPAIR) from None


def update_settings(ws: Workspace, **changes: Any) -> Settings:
    """Change requirement and budget fields (None leaves a field as it is; "" clears it).

    Every value is checked before anything is written: on an error nothing is stored."""
    apply_changes(None, changes)  # refuse bad input before touching the store
    result: dict[str, Settings] = {}

    def change(current: Any) -> Any:
        settings = apply_changes(current, changes)
        doc = settings.to_json()
        dumps_strict(doc, "the workspace settings", error=UsageError)  # never NaN or Infinity in the store
        result["settings"] = settings
        return doc

    ws.store.update_doc(ws.workspace_id, "settings", change)
    return result["settings"]


__all__ = ["DEFAULT_HOURS", "FIELD_NAMES", "Settings", "load_settings", "update_settings"]
