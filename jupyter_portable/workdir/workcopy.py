"""A workspace copy on disk: ``DIR/.portable/`` and everything it keeps.

Nothing here talks to the store. :class:`WorkspaceCopy` is the one owner of ``.portable/``:
every file there is written by a named method of the copy, replaced atomically (temp, fsync,
rename), and every lock there is a named ``flock`` of the copy (:data:`KEPT_FILES` lists them
all, and docs/architecture.md draws them).
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlparse

from jupyter_portable.core import hooks
from jupyter_portable.core.errors import ManifestError, PortableError, UnsafePath, UsageError, WorkspaceNotFound
from jupyter_portable.core.paths import RESERVED_TOP
from jupyter_portable.core.validate import check_workspace_id, short_repr
from jupyter_portable.workdir.files import atomic_open, file_lock

if TYPE_CHECKING:
    from jupyter_portable.workdir.statcache import StatCache

PORTABLE_DIR = RESERVED_TOP  # core.paths: the one top-level name no workspace file may have
CONFIG_NAME = "workspace.json"
CONFIG_FORMAT = "jupyter-portable.workspace"
CONFIG_MAX = 64 * 1024  # the file holds a few short fields; anything bigger is not ours

# The names under .portable/ (on disk since the first release: never rename one).
RESTORING_NAME = "restoring.json"
INTENT_NAME = "publishing.json"
TMP_DIR = "tmp"
LIFECYCLE_NAME = "lifecycle.json"
LIFECYCLE_LOCK = "lifecycle.lock"
CONTINUE_LOCK = "continue.lock"
AGENTS_DIR = "agents"
UNRECORDED_NAME = "unrecorded-reservations.json"
PENDING_NAME = "pending.json"
PENDING_LOCK = "pending.lock"
LOCKS_DIR = "locks"
FETCHER_LOCK = "fetcher.lock"
FETCHER_LOG = "lazy.log"
CONFLICTS_NAME = "conflicts.json"
CONFLICTS_LOCK = "conflicts.lock"
FOLLOW_NAME = "follow.json"
NEXT_ACTION_NAME = "next_action.json"
RUNTIME_NAME = "runtime.json"
INBOUND_ALLOW_NAME = "inbound-allow"
INFLIGHT_DIR = "checkpoints-inflight"  # one file per checkpoint still uploading (engine/checkpoint/background.py)
INBOUND_ALLOW_MAX = 64 * 1024  # a few patterns typed by a person


@dataclass(frozen=True)
class KeptFile:
    """One thing the copy keeps in ``.portable/``: its name (``*`` for one of a family), the
    copy's method that writes it and the lock that guards it (None: written whole, last one wins)."""

    name: str
    writer: str
    lock: str | None = None


KEPT_FILES: tuple[KeptFile, ...] = (
    KeptFile(CONFIG_NAME, "write_config"),
    KeptFile("statcache.sqlite", "statcache", "sqlite's own locks"),
    KeptFile("statcache.sqlite-*", "statcache", "sqlite's own locks"),
    KeptFile(RESTORING_NAME, "write_restoring"),
    KeptFile(f"{TMP_DIR}/*", "tmp_dir (a restore's or fetch's files before their rename)"),
    KeptFile(INTENT_NAME, "write_intent"),
    KeptFile(LIFECYCLE_NAME, "write_lifecycle", "lifecycle_lock"),
    KeptFile(LIFECYCLE_LOCK, "lifecycle_lock"),
    KeptFile(CONTINUE_LOCK, "continue_lock"),
    KeptFile(f"{AGENTS_DIR}/*.json", "write_agent (mode 0600: it holds the token)"),
    KeptFile(f"{AGENTS_DIR}/*.allocation.json", "write_agent_allocation"),
    KeptFile(UNRECORDED_NAME, "write_unrecorded_reservations (mode 0600)"),
    KeptFile(PENDING_NAME, "write_pending", "pending_lock"),
    KeptFile(PENDING_LOCK, "pending_lock"),
    KeptFile(f"{LOCKS_DIR}/*.lock", "fetch_lock"),
    KeptFile(FETCHER_LOCK, "fetcher_lock"),
    KeptFile(FETCHER_LOG, "open_fetcher_log", "fetcher_lock"),
    KeptFile(CONFLICTS_NAME, "write_conflicts", "conflicts_lock"),
    KeptFile(CONFLICTS_LOCK, "conflicts_lock"),
    KeptFile(FOLLOW_NAME, "write_follow"),
    KeptFile(NEXT_ACTION_NAME, "write_next_action"),
    KeptFile(RUNTIME_NAME, "write_runtime"),
    KeptFile(f"{INFLIGHT_DIR}/*.json", "write_inflight (each file by the one process uploading it)"),
    KeptFile(INBOUND_ALLOW_NAME, "write_inbound_allow (or the user, by hand: never a machine or a store)"),
)


def _one_name(name: str, what: str) -> str:
    """``name`` as one file name in a folder of ``.portable/``: never a way out of it."""
    if not name or "/" in name or "\\" in name or "\x00" in name or name in (".", ".."):
        raise UnsafePath(f"{what} {short_repr(name)} cannot name a file")
    return name


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
    """The local files of one workspace copy rooted at ``root``.

    The copy alone writes its ``.portable/`` folder: each file it keeps has a named method here
    (and each lock a named context manager), every write is :meth:`_write` (temp, fsync,
    rename) and every lock an ``flock`` that dies with its holder. :data:`KEPT_FILES` lists them."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._meta = self.root / PORTABLE_DIR

    @classmethod
    def find(cls, start: str | os.PathLike[str] = ".") -> "WorkspaceCopy":
        here = Path(start).resolve()
        for folder in (here, *here.parents):
            if (folder / PORTABLE_DIR / CONFIG_NAME).is_file():
                return cls(folder)
        raise WorkspaceNotFound(f"no workspace at {here} or above it")

    # -- the one writer, reader and lock of .portable/ -------------------------------------------

    def _write(self, name: str, data: bytes, *, mode: int = 0o666) -> None:
        """Every write of ``.portable/``: whole or not at all (``mode`` before the umask)."""
        with atomic_open(self._meta / name, mode) as fh:
            fh.write(data)
            # the crash tests die here too (tests/test_crash.py): the new bytes not yet renamed in
            hooks.step(f"writing .portable/{name}")

    def _read(self, name: str) -> bytes | None:
        """The file's bytes; None where it was never written."""
        try:
            return (self._meta / name).read_bytes()
        except FileNotFoundError:
            return None

    def _unlink(self, name: str) -> None:
        (self._meta / name).unlink(missing_ok=True)

    def _lock(self, name: str, *, wait_s: float | None = None, busy: str | None = None,
              hint: str | None = None) -> "AbstractContextManager[None]":
        return file_lock(self._meta / name, wait_s=wait_s, busy=busy, hint=hint)

    # -- workspace.json: which workspace, where, at which version --------------------------------

    @property
    def config_path(self) -> Path:
        return self._meta / CONFIG_NAME

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
        self._write(CONFIG_NAME, config.to_bytes())

    # -- the stat cache (``workdir/statcache.py``): what the last snapshot or restore saw --------

    def statcache(self) -> "StatCache":
        """This copy's stat cache, to be used as a context manager."""
        from jupyter_portable.workdir.statcache import StatCache

        return StatCache(self._meta)

    def open_statcache(self, error: type[PortableError] = UsageError) -> "StatCache":
        """This copy's stat cache, opened (close it); ``error`` when sqlite cannot open it."""
        import sqlite3

        cache = self.statcache()
        try:
            cache.open()
        except sqlite3.Error as exc:
            raise error(f"cannot open the stat cache {self.statcache_path}: {exc}",
                        hint="delete .portable/statcache.sqlite (it is only a cache)") from exc
        return cache

    @property
    def statcache_path(self) -> Path:
        """The stat cache's sqlite file (for messages; it is opened through :meth:`statcache`)."""
        from jupyter_portable.workdir.statcache import NAME

        return self._meta / NAME

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

    # -- a restore in progress ---------------------------------------------------------------------
    # It names its workspace here, so that a restore cut short can be run again over its own
    # partial files without being taken for a foreign folder.

    def write_restoring(self, workspace_id: str) -> None:
        self._write(RESTORING_NAME, json.dumps({"workspace_id": workspace_id}).encode())

    def read_restoring(self) -> str | None:
        """The workspace a restore into this folder was started for, if one did not finish."""
        try:
            with open(self._meta / RESTORING_NAME, "rb") as fh:
                obj = load_json(fh.read(CONFIG_MAX + 1))
        except (OSError, ValueError):
            return None
        ws = obj.get("workspace_id") if isinstance(obj, dict) else None
        return ws if isinstance(ws, str) else None

    def clear_restoring(self) -> None:
        self._unlink(RESTORING_NAME)

    @property
    def tmp_dir(self) -> Path:
        """Where a restore or fetch makes its files before renaming them into place."""
        return self._meta / TMP_DIR

    def clear_tmp(self) -> None:
        shutil.rmtree(self.tmp_dir, ignore_errors=True)

    # -- the publish intent: the version and manifest hash a snapshot is about to publish ---------

    def write_intent(self, version: int, manifest: str) -> None:
        self._write(INTENT_NAME, json.dumps({"version": version, "manifest": manifest}).encode())

    def read_intent(self) -> tuple[int, str] | None:
        try:
            obj = load_json(self._read(INTENT_NAME) or b"")
            return int(obj["version"]), str(obj["manifest"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def clear_intent(self) -> None:
        self._unlink(INTENT_NAME)

    # -- the lifecycle (``workdir/lifecycle_file.py``) and the one Continue or Stop at a time -----

    @property
    def lifecycle_path(self) -> Path:
        return self._meta / LIFECYCLE_NAME

    def lifecycle_bytes(self) -> bytes | None:
        return self._read(LIFECYCLE_NAME)

    def write_lifecycle(self, data: bytes) -> None:
        """Replace the lifecycle; hold :meth:`lifecycle_lock` (a read-modify-write)."""
        self._write(LIFECYCLE_NAME, data)

    def lifecycle_lock(self, timeout_s: float) -> "AbstractContextManager[None]":
        """The lock of every lifecycle change, waited for ``timeout_s`` seconds."""
        # A separate lock file: the record itself is replaced by rename, so a lock on it would
        # be a lock on an inode that the next writer throws away.
        return self._lock(LIFECYCLE_LOCK, wait_s=timeout_s,
                          busy=f"another process has held {self._meta / LIFECYCLE_LOCK} for {timeout_s:g}s",
                          hint="wait for the other `jupyter portable` command or server to finish")

    def continue_lock(self, *, busy: str | None = None, hint: str | None = None) -> "AbstractContextManager[None]":
        """One Continue or Stop at a time per copy, across processes; ConflictError at once when held."""
        return self._lock(CONTINUE_LOCK, wait_s=0, busy=busy, hint=hint)

    # -- worker agents and their tokens (``worker/client.py``) -------------------------------------

    def _agent_file(self, allocation_id: str, suffix: str) -> str:
        _one_name(allocation_id, "an allocation id")
        return f"{AGENTS_DIR}/{allocation_id}{suffix}"

    def _write_agent_file(self, name: str, data: bytes, mode: int) -> None:
        (self._meta / AGENTS_DIR).mkdir(parents=True, exist_ok=True, mode=0o700)
        self._write(name, data, mode=mode)

    def agent_bytes(self, allocation_id: str) -> bytes | None:
        return self._read(self._agent_file(allocation_id, ".json"))

    def write_agent(self, allocation_id: str, data: bytes) -> None:
        """The agent's record: it holds the agent's token, so it is the user's alone (0600)."""
        self._write_agent_file(self._agent_file(allocation_id, ".json"), data, 0o600)

    def agent_allocation_bytes(self, allocation_id: str) -> bytes | None:
        return self._read(self._agent_file(allocation_id, ".allocation.json"))

    def write_agent_allocation(self, allocation_id: str, data: bytes) -> None:
        self._write_agent_file(self._agent_file(allocation_id, ".allocation.json"), data, 0o666)

    def forget_agent(self, allocation_id: str) -> None:
        for suffix in (".json", ".allocation.json"):
            self._unlink(self._agent_file(allocation_id, suffix))

    # -- reservations bought but not yet recorded in the store (``orchestration/reservations``) ---

    def unrecorded_reservations_bytes(self) -> bytes | None:
        return self._read(UNRECORDED_NAME)

    def write_unrecorded_reservations(self, data: bytes) -> None:
        self._write(UNRECORDED_NAME, data, mode=0o600)

    def clear_unrecorded_reservations(self) -> None:
        self._unlink(UNRECORDED_NAME)

    # -- a lazy restore's pending fetches (``workdir/pending.py``, ``engine/lazy.py``) -------------

    @property
    def pending_path(self) -> Path:
        return self._meta / PENDING_NAME

    def pending_bytes(self) -> bytes | None:
        return self._read(PENDING_NAME)

    def write_pending(self, data: bytes) -> None:
        """Replace the pending list; a fetcher holds :meth:`pending_lock` (a read-modify-write)."""
        self._write(PENDING_NAME, data)

    def clear_pending(self) -> None:
        self._unlink(PENDING_NAME)

    def pending_lock(self) -> "AbstractContextManager[None]":
        """The lock of a change to the pending list, waited for as long as it takes."""
        return self._lock(PENDING_LOCK)

    def fetch_lock(self, content_hash: str) -> "AbstractContextManager[None]":
        """Held while one pending file is fetched, so each is fetched once."""
        _one_name(content_hash, "a content hash")
        return self._lock(f"{LOCKS_DIR}/{content_hash}.lock")

    def fetcher_lock(self) -> "AbstractContextManager[None]":
        """Held by the one background fetcher of this copy."""
        return self._lock(FETCHER_LOCK)

    def open_fetcher_log(self) -> BinaryIO:
        """The background fetcher's log, opened for appending (its stdout and stderr)."""
        self._meta.mkdir(parents=True, exist_ok=True)
        return open(self._meta / FETCHER_LOG, "ab")

    # -- files edited on both sides (``workdir/conflicts.py``) ------------------------------------

    def conflicts_bytes(self) -> bytes | None:
        return self._read(CONFLICTS_NAME)

    def write_conflicts(self, data: bytes) -> None:
        self._write(CONFLICTS_NAME, data)

    def conflicts_lock(self) -> "AbstractContextManager[None]":
        """Held across a read and write of the conflicts (the server's monitor and its follow loop
        both add to them)."""
        return self._lock(CONFLICTS_LOCK)

    # -- what the copy and its worker agreed on (``workdir/follow_record.py``) --------------------

    def follow_bytes(self) -> bytes | None:
        return self._read(FOLLOW_NAME)

    def write_follow(self, data: bytes) -> None:
        self._write(FOLLOW_NAME, data)

    # -- the next action (``workdir/next_action.py``) ----------------------------------------------

    def next_action_bytes(self) -> bytes | None:
        return self._read(NEXT_ACTION_NAME)

    def write_next_action(self, data: bytes) -> None:
        self._write(NEXT_ACTION_NAME, data)

    # -- the runtime record cached by environment (``engine/runtime/record.py``) -------------------

    def runtime_bytes(self) -> bytes | None:
        return self._read(RUNTIME_NAME)

    def write_runtime(self, data: bytes) -> None:
        self._write(RUNTIME_NAME, data)

    # -- checkpoints in flight (``engine/checkpoint/background.py``) -------------------------------

    def write_inflight(self, key: str, data: bytes) -> None:
        """One checkpoint still uploading, written only by the process that uploads it."""
        (self._meta / INFLIGHT_DIR).mkdir(parents=True, exist_ok=True)
        self._write(f"{INFLIGHT_DIR}/{_one_name(key, 'an in-flight key')}.json", data)

    def clear_inflight(self, key: str) -> None:
        self._unlink(f"{INFLIGHT_DIR}/{_one_name(key, 'an in-flight key')}.json")

    def inflight_records(self) -> list[bytes]:
        """Every in-flight checkpoint's record, as written (oldest name first)."""
        folder = self._meta / INFLIGHT_DIR
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            data = self._read(f"{INFLIGHT_DIR}/{name}")
            if data is not None:
                out.append(data)
        return out

    # -- the user's opt-ins past the inbound gate's deny-list (``engine/gate.py``) ------------------

    def inbound_allow_lines(self) -> list[str]:
        """The patterns (gitignore syntax) of deny-listed paths the user lets a machine or a store write here."""
        data = self._read(INBOUND_ALLOW_NAME)
        if data is None:
            return []
        if len(data) > INBOUND_ALLOW_MAX:
            raise UsageError(f"{self._meta / INBOUND_ALLOW_NAME} is over {INBOUND_ALLOW_MAX} bytes",
                             hint="keep one gitignore-style pattern a line there")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"{self._meta / INBOUND_ALLOW_NAME} is not UTF-8 text: {exc}",
                             hint="keep one gitignore-style pattern a line there") from None
        return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]

    def write_inbound_allow(self, lines: list[str]) -> None:
        self._write(INBOUND_ALLOW_NAME, "".join(f"{line}\n" for line in lines).encode("utf-8"))
