"""A workspace copy on disk: ``DIR/.portable/`` with its config, stat cache and pending list.

Nothing here talks to the store. Every file is replaced atomically (temp, fsync, rename).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from jupyter_portable.core.errors import ManifestError, UsageError, WorkspaceNotFound
from jupyter_portable.core.validate import check_workspace_id
from jupyter_portable.workdir.files import atomic_write

PORTABLE_DIR = ".portable"
if TYPE_CHECKING:
    from jupyter_portable.workdir.statcache import StatCache

CONFIG_NAME = "workspace.json"
CONFIG_FORMAT = "jupyter-portable.workspace"
CONFIG_MAX = 64 * 1024  # the file holds a few short fields; anything bigger is not ours


def load_json(data: bytes) -> Any:
    """``json.loads`` whose every failure is a ValueError: nesting too deep for the parser too."""
    try:
        return json.loads(data)
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc


def check_store_url(url: str) -> str:
    """Refuse store URLs that carry credentials: they would be written to disk."""
    parsed = urlparse(url)
    if parsed.password or (parsed.username and parsed.scheme not in ("", "file")):
        raise UsageError(
            "the store URL carries credentials, which would be saved in .portable/workspace.json",
            hint="put credentials in the environment or an AWS profile, not in the URL",
        )
    return url


@dataclass
class CopyConfig:
    """What ``.portable/workspace.json`` says: which workspace, where, at which version."""

    workspace_id: str
    store: str
    version: int = 0
    epoch: int = 0

    def to_bytes(self) -> bytes:
        return json.dumps({"format": CONFIG_FORMAT, "schema": 1, "workspace_id": self.workspace_id,
                           "store": self.store, "version": self.version, "epoch": self.epoch},
                          indent=2).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, where: Path) -> "CopyConfig":
        fix = "move it aside and restore the workspace into this folder again"
        if len(data) > CONFIG_MAX:
            raise ManifestError(f"{where} is over {CONFIG_MAX // 1024} KiB, too big to be a jupyter-portable "
                                "workspace file", hint=fix)
        try:
            obj = load_json(data)
        except ValueError as exc:
            raise ManifestError(f"{where} is not valid JSON: {exc}", hint=fix) from exc
        if not isinstance(obj, dict) or obj.get("format") != CONFIG_FORMAT or obj.get("schema") != 1:
            raise ManifestError(f"{where} is not a jupyter-portable workspace file")
        ws, store = obj.get("workspace_id"), obj.get("store")
        version, epoch = obj.get("version", 0), obj.get("epoch", 0)
        if not isinstance(store, str) or not isinstance(version, int) or not isinstance(epoch, int) \
                or version < 0 or epoch < 0:
            raise ManifestError(f"{where} has a bad store, version or epoch")
        return cls(check_workspace_id(ws), check_store_url(store), version, epoch)


class WorkspaceCopy:
    """The local files of one workspace copy rooted at ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.meta = self.root / PORTABLE_DIR

    @classmethod
    def find(cls, start: str | os.PathLike[str] = ".") -> "WorkspaceCopy":
        here = Path(start).resolve()
        for folder in (here, *here.parents):
            if (folder / PORTABLE_DIR / CONFIG_NAME).is_file():
                return cls(folder)
        raise WorkspaceNotFound(f"no workspace at {here} or above it")

    @property
    def config_path(self) -> Path:
        return self.meta / CONFIG_NAME

    def exists(self) -> bool:
        return self.config_path.is_file()

    def read_config(self) -> CopyConfig:
        try:
            with open(self.config_path, "rb") as fh:
                data = fh.read(CONFIG_MAX + 1)
        except FileNotFoundError as exc:
            raise WorkspaceNotFound(f"no workspace at {self.root}") from exc
        return CopyConfig.from_bytes(data, self.config_path)

    def write_config(self, config: CopyConfig) -> None:
        atomic_write(self.config_path, config.to_bytes())

    # The stat cache (``workdir/statcache.py``): what the last snapshot or restore saw.
    def statcache(self) -> "StatCache":
        """This copy's stat cache, to be used as a context manager."""
        from jupyter_portable.workdir.statcache import StatCache

        return StatCache(self.meta)

    def advance(self, version: int) -> None:
        """Move this copy from ``version - 1`` to ``version``, a version with the same files."""
        import sqlite3

        cfg = self.read_config()
        if cfg.version != version - 1:
            return
        cfg.version = version
        self.write_config(cfg)
        try:
            with self.statcache() as cache:
                if cache.valid_for(version - 1):
                    cache.set_version(version, keep_env=True)
        except sqlite3.Error:
            pass  # only a cache: the next snapshot reads every file again

    @property
    def pending_path(self) -> Path:
        return self.meta / "pending.json"

    @property
    def tmp_dir(self) -> Path:
        return self.meta / "tmp"

    # A restore in progress names its workspace here, so that a restore cut short can be
    # run again over its own partial files without being taken for a foreign folder.
    @property
    def restoring_path(self) -> Path:
        return self.meta / "restoring.json"

    def write_restoring(self, workspace_id: str) -> None:
        atomic_write(self.restoring_path, json.dumps({"workspace_id": workspace_id}).encode())

    def read_restoring(self) -> str | None:
        """The workspace a restore into this folder was started for, if one did not finish."""
        try:
            with open(self.restoring_path, "rb") as fh:
                obj = load_json(fh.read(CONFIG_MAX + 1))
        except (OSError, ValueError):
            return None
        ws = obj.get("workspace_id") if isinstance(obj, dict) else None
        return ws if isinstance(ws, str) else None

    def clear_restoring(self) -> None:
        self.restoring_path.unlink(missing_ok=True)

    # The publish intent: the version and manifest hash a snapshot is about to publish.
    @property
    def intent_path(self) -> Path:
        return self.meta / "publishing.json"

    def write_intent(self, version: int, manifest: str) -> None:
        atomic_write(self.intent_path, json.dumps({"version": version, "manifest": manifest}).encode())

    def read_intent(self) -> tuple[int, str] | None:
        try:
            obj = load_json(self.intent_path.read_bytes())
            return int(obj["version"]), str(obj["manifest"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def clear_intent(self) -> None:
        self.intent_path.unlink(missing_ok=True)
