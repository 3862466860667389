"""The pending list of a lazy restore: ``.portable/pending.json`` names the large files still
to be fetched, with the version they belong to."""

from __future__ import annotations

import json

from jupyter_portable.core.errors import ManifestError
from jupyter_portable.core.manifest import FileEntry
from jupyter_portable.workdir.workcopy import WorkspaceCopy


def write_pending(copy: WorkspaceCopy, version: int, entries: list[FileEntry]) -> None:
    body = {"version": version, "files": [e.to_json() for e in entries]}
    copy.write_pending(json.dumps(body).encode())


def read_pending(copy: WorkspaceCopy) -> tuple[int, list[FileEntry]]:
    """The version and entries still to be fetched by a lazy restore (validated)."""
    data = copy.pending_bytes()
    if data is None:
        return 0, []
    try:
        obj = json.loads(data)
    except ValueError as exc:
        raise ManifestError(f"{copy.pending_path} is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict) or not isinstance(obj.get("files"), list):
        raise ManifestError(f"{copy.pending_path} is malformed")
    return int(obj.get("version", 0)), [FileEntry.from_json(e) for e in obj["files"]]
