"""What JupyterLab's file browser follows while this worker serves the workspace: the copy's
files with their content hashes, and one file's bytes (docs/file-browser.md).

The server asks for the listing every few seconds; a file is hashed again only when its
size, mtime, ctime or inode changed since the last listing, so a quiet workspace costs one
walk. Files larger than :data:`FOLLOW_MAX_BYTES` are listed without a hash and never sent:
they reach the user's copy through the store, not through this API.
"""

from __future__ import annotations

import base64
import os
import threading
from typing import Any

from jupyter_portable.core.errors import UnsafePath, UsageError
from jupyter_portable.core.paths import check_relpath
from jupyter_portable.store.repo import digest, hash_file
from jupyter_portable.workdir.statcache import stat_key
from jupyter_portable.workdir.workcopy import WorkspaceCopy
from jupyter_portable.worker.agent import check_fits
from jupyter_portable.worker.state import AgentState

FOLLOW_MAX_BYTES = 64 * 2**20  # the largest body the agent takes for a save, the same both ways


class FileHashes:
    """The worker copy's files with their hashes, hashing only what changed since the last call."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[tuple[int, int, int, int], str]] = {}
        self._lock = threading.Lock()

    def tree(self, state: AgentState) -> dict[str, Any]:
        """``{"version", "files": [{"path", "size", "hash"}], "pending"}``; ``hash`` is None for a file
        over the limit or one being written."""
        from jupyter_portable.engine.lazy import pending_paths
        from jupyter_portable.engine.listing import walk

        copy = WorkspaceCopy(state.workdir)
        with self._lock:
            known: dict[str, tuple[tuple[int, int, int, int], str]] = {}
            files = []
            for f in walk(state.workdir, warn=False):
                if f.target is not None:
                    continue
                size, h = f.st.st_size, None
                if size <= FOLLOW_MAX_BYTES:
                    key = stat_key(f.st)
                    old = self._known.get(f.path)
                    if old is not None and old[0] == key:
                        h = old[1]
                    else:
                        try:
                            h = hash_file(state.workdir / f.path, size)
                            after = stat_key(os.stat(state.workdir / f.path))
                        except OSError:
                            continue  # removed since the walk
                        if after != key:
                            h = None  # being written: listed (it is not gone), hashed once it is still
                    if h is not None:
                        known[f.path] = (key, h)
                files.append({"path": f.path, "size": size, "hash": h})
            self._known = known
        return {"version": copy.read_config().version, "files": files, "pending": pending_paths(copy)}


def read_file(state: AgentState, rel: str) -> dict[str, Any]:
    """One file's bytes (base64) and their hash, for the user's copy."""
    rel = check_relpath(rel)
    check_fits(state.workdir, rel)  # a name or path this filesystem cannot hold is a 400, not an OSError
    root = os.path.realpath(state.workdir)
    full = os.path.join(root, rel)
    real = os.path.realpath(full)
    if real != full or not real.startswith(root + os.sep):
        raise UnsafePath(f"{rel}: it leads outside the workspace or through a symlink")
    try:
        fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise UsageError(f"{rel} is not on the worker", hint="list the files again") from None
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > FOLLOW_MAX_BYTES:
            raise UsageError(f"{rel} is {size} bytes; the worker sends at most {FOLLOW_MAX_BYTES} this way",
                             hint="it reaches your copy with the next snapshot (`jupyter portable restore`)")
        data = fh.read(FOLLOW_MAX_BYTES + 1)
    if len(data) > FOLLOW_MAX_BYTES:
        raise UsageError(f"{rel} grew past {FOLLOW_MAX_BYTES} bytes while it was read",
                         hint="it reaches your copy with the next snapshot")
    return {"path": rel, "hash": digest(data), "size": len(data), "content": base64.b64encode(data).decode()}


__all__ = ["FOLLOW_MAX_BYTES", "FileHashes", "read_file"]
