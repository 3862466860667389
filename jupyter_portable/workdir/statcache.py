"""The stat cache: ``.portable/statcache.sqlite``, what the last snapshot or restore saw.

For each recorded file its size, mtime, ctime and inode (a symlink: its target; unknown:
all NULL) and for each folder the tree it was stored as and the signature of its listing
(``Lister.quick``: while it holds, none of the folder's files is looked at one by one),
all valid for one version. A
snapshot reads one folder's rows at a time and writes back only the folders that changed,
in one transaction committed after the version is published. Deleting it is always safe.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

NAME = "statcache.sqlite"
_LAYOUT = 4  # PRAGMA user_version of this layout; 2 gains the sig column, 2 and 3 a new blobs table, any other
# is dropped and rebuilt
_I64 = 2**63
ROOT = 1  # the root folder's id

Key = tuple[int, int, int, int] | str | None  # (size, mtime_ns, ctime_ns, inode) | symlink target | unknown

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT);
CREATE TABLE IF NOT EXISTS dirs (id INTEGER PRIMARY KEY, parent INTEGER NOT NULL, name TEXT NOT NULL,
    tree TEXT, files INTEGER, bytes INTEGER, sig BLOB, UNIQUE (parent, name));
CREATE TABLE IF NOT EXISTS files (dir INTEGER NOT NULL, name TEXT NOT NULL, size INTEGER, mtime INTEGER,
    ctime INTEGER, ino INTEGER, target TEXT, PRIMARY KEY (dir, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS packs (id INTEGER PRIMARY KEY, hash TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS blobs (hash BLOB PRIMARY KEY, pack INTEGER NOT NULL, offset INTEGER NOT NULL,
    length INTEGER NOT NULL) WITHOUT ROWID;
"""


def _row(key: Key) -> tuple[Any, Any, Any, Any, Any]:
    if key is None:
        return (None, None, None, None, None)
    if isinstance(key, str):
        return (None, None, None, None, key)
    size, mtime, ctime, ino = key
    if not (-_I64 <= mtime < _I64 and -_I64 <= ctime < _I64 and 0 <= size < _I64 and 0 <= ino < 2 * _I64):
        return (None, None, None, None, None)  # a time SQLite cannot hold: re-read the file next time
    return (size, mtime, ctime, ino - 2 * _I64 if ino >= _I64 else ino, None)


Row = tuple[str, Any, Any, Any, Any, Any]  # a file's row in a folder: (name, size, mtime, ctime, inode, target)


def file_row(name: str, key: Key) -> Row:
    """What :meth:`StatCache.put_rows` stores for one file (made where the file was listed)."""
    return (_text(name), *_row(key))


def _key(size: Any, mtime: Any, ctime: Any, ino: Any, target: Any) -> Key:
    if target is not None:
        return str(target)
    if size is None:
        return None
    return (size, mtime, ctime, ino + 2 * _I64 if ino < 0 else ino)


def _text(name: str) -> str:
    # Names that are not UTF-8 reach Python as lone surrogates, which SQLite cannot store as text.
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace") \
        if not name.isascii() and _has_surrogate(name) else name


def _has_surrogate(name: str) -> bool:
    return any("\udc80" <= ch <= "\udcff" for ch in name)


class StatCache:
    """One copy's stat cache. Use as a context manager; every method raises only sqlite3 errors."""

    def __init__(self, meta: Path) -> None:
        self.path = meta / NAME
        self.db: sqlite3.Connection | None = None

    def __enter__(self) -> "StatCache":
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = self._connect()
        except sqlite3.DatabaseError:
            self._remove()  # a damaged cache is only a cache
            self.db = self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, timeout=5.0, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            # 32 MiB of pages (the default is 2): a first snapshot of a million files inserts as
            # many random blob keys, which a small cache turns into a write per insert
            db.execute("PRAGMA cache_size=-32768")
            layout = db.execute("PRAGMA user_version").fetchone()[0]
            if layout in (2, 3):
                if layout == 2:
                    db.execute("ALTER TABLE dirs ADD COLUMN sig BLOB")
                # blobs as raw bytes, their packs by number: a third of the size, and a million
                # first-snapshot inserts in 7 s instead of 12
                db.execute("DROP TABLE IF EXISTS blobs")
                db.executescript(_SCHEMA)
                db.execute(f"PRAGMA user_version={_LAYOUT}")
            elif layout != _LAYOUT:
                db.executescript("DROP TABLE IF EXISTS meta; DROP TABLE IF EXISTS dirs; DROP TABLE IF EXISTS files; "
                                 "DROP TABLE IF EXISTS blobs; DROP TABLE IF EXISTS packs;")
                db.executescript(_SCHEMA)
                db.execute(f"PRAGMA user_version={_LAYOUT}")
        except BaseException:
            db.close()
            raise
        return db

    def _remove(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(str(self.path) + suffix)

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    @property
    def _db(self) -> sqlite3.Connection:
        assert self.db is not None, "StatCache used outside `with`"
        return self.db

    # -- which version it describes --------------------------------------------------

    def meta(self, k: str) -> str | None:
        row = self._db.execute("SELECT v FROM meta WHERE k=?", (k,)).fetchone()
        return None if row is None else row[0]

    def version(self) -> int | None:
        v = self.meta("version")
        return int(v) if v is not None and v.isdigit() else None

    def fingerprint(self) -> str | None:
        return self.meta("env")

    def valid_for(self, version: int) -> bool:
        return self.version() == version

    def set_version(self, version: int, fingerprint: str | None = None, *, keep_env: bool = False,
                    journal: str | None = None) -> None:
        """Say which version the rows describe. ``journal``: the token of the change journal's cut
        that the walk which wrote them took first (``engine/journal``); any other writer clears it,
        so that the next snapshot walks the whole tree."""
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('version', ?)", (str(version),))
        if not keep_env:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('env', ?)", (fingerprint,))
        self.set_journal(journal)

    def journal(self) -> str | None:
        """The token of the journal cut these rows follow (see :meth:`set_version`)."""
        return self.meta("journal")

    def set_journal(self, token: str | None) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('journal', ?)", (token,))

    def link_folders(self) -> set[str] | None:
        """Folders holding a symlink (recorded or leading outside) when last listed: a journal
        snapshot lists them every time, since what a link resolves to can change with no event
        of its own. None where unknown (never written by a walk)."""
        raw = self.meta("links")
        if raw is None:
            return None
        try:
            got = json.loads(raw)
        except ValueError:
            return None
        return {p for p in got if isinstance(p, str)} if isinstance(got, list) else None

    def set_link_folders(self, folders: Iterable[str]) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('links', ?)", (json.dumps(sorted(folders)),))

    # -- transactions ------------------------------------------------------------------

    def begin(self, tries: int = 1) -> None:
        """The write transaction: one writer of the copy's cache at a time, in any process. Each try
        waits sqlite's busy timeout (5 s) for the writer ahead, ``tries`` of them at most (a snapshot
        waits for another of the same copy: a checkpoint's upload takes minutes), then the error."""
        for attempt in range(tries):
            try:
                self._db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or attempt == tries - 1:
                    raise

    def commit(self) -> None:
        if self._db.in_transaction:
            self._db.execute("COMMIT")

    def rollback(self) -> None:
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def abandon(self) -> None:
        """Roll back after a failed snapshot or restore, whose own error is the one to raise: a
        cache that cannot even roll back is only a cache (the next open finds it as it is)."""
        with contextlib.suppress(sqlite3.Error):
            self.rollback()

    def clear(self) -> None:
        self._db.execute("DELETE FROM files")
        self._db.execute("DELETE FROM dirs")
        self._db.execute("DELETE FROM meta")
        self._db.execute("INSERT INTO dirs (id, parent, name) VALUES (?, 0, '')", (ROOT,))

    # -- folders and files -------------------------------------------------------------

    def child(self, parent: int, name: str) -> tuple[int, str | None, int, int] | None:
        """``(id, tree, files, bytes)`` of folder ``name`` in folder ``parent``."""
        row = self._db.execute("SELECT id, tree, files, bytes FROM dirs WHERE parent=? AND name=?",
                               (parent, _text(name))).fetchone()
        return None if row is None else (row[0], row[1], row[2] or 0, row[3] or 0)

    def folder(self, dir_id: int) -> tuple[str | None, int, int] | None:
        row = self._db.execute("SELECT tree, files, bytes FROM dirs WHERE id=?", (dir_id,)).fetchone()
        return None if row is None else (row[0], row[1] or 0, row[2] or 0)

    def children(self, parent: int) -> dict[str, tuple[int, str | None]]:
        return {name: (i, tree) for i, name, tree in
                self._db.execute("SELECT id, name, tree FROM dirs WHERE parent=?", (parent,))}

    def rows(self, dir_id: int) -> dict[str, Key]:
        """Every file's key in one folder (names not UTF-8 come back as stored, see ``lookup_name``)."""
        return {name: _key(*rest) for name, *rest in
                self._db.execute("SELECT name, size, mtime, ctime, ino, target FROM files WHERE dir=?", (dir_id,))}

    @staticmethod
    def lookup_name(name: str) -> str:
        """The form ``rows`` uses for a name found on disk."""
        return _text(name)

    def ensure_dir(self, parent: int, name: str) -> int:
        got = self.child(parent, name)
        if got is not None:
            return got[0]
        cur = self._db.execute("INSERT INTO dirs (parent, name) VALUES (?, ?)", (parent, _text(name)))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def set_folder(self, dir_id: int, tree: str | None, files: int, nbytes: int) -> None:
        self._db.execute("UPDATE dirs SET tree=?, files=?, bytes=? WHERE id=?", (tree, files, nbytes, dir_id))

    def sig(self, dir_id: int) -> bytes | None:
        """The signature of the folder's listing when its rows were last written whole, if any."""
        row = self._db.execute("SELECT sig FROM dirs WHERE id=?", (dir_id,)).fetchone()
        return None if row is None else row[0]

    def set_sig(self, dir_id: int, sig: bytes | None) -> None:
        self._db.execute("UPDATE dirs SET sig=? WHERE id=?", (sig, dir_id))

    def replace_rows(self, dir_id: int, rows: Iterable[tuple[str, Key]]) -> None:
        """Make folder ``dir_id`` hold exactly ``rows``."""
        self._db.execute("DELETE FROM files WHERE dir=?", (dir_id,))
        self.add_rows(dir_id, rows)

    def add_rows(self, dir_id: int, rows: Iterable[tuple[str, Key]]) -> None:
        """Record files of folder ``dir_id``; its signature no longer holds."""
        self._db.execute("UPDATE dirs SET sig=NULL WHERE id=? AND sig IS NOT NULL", (dir_id,))
        self._db.executemany("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?)",
                             ((dir_id, _text(name), *_row(key)) for name, key in rows))

    def put_rows(self, dir_id: int, rows: list[Row]) -> None:
        """Add :func:`file_row` rows to folder ``dir_id`` (a folder written whole: its
        signature is set afterwards, or not at all)."""
        self._db.executemany(f"INSERT OR REPLACE INTO files VALUES ({int(dir_id)}, ?, ?, ?, ?, ?, ?)", rows)

    def drop_folder(self, dir_id: int) -> None:
        """Forget a folder and everything under it."""
        ids = [r[0] for r in self._db.execute(
            "WITH RECURSIVE sub(id) AS (SELECT ? UNION ALL SELECT d.id FROM dirs d JOIN sub ON d.parent = sub.id) "
            "SELECT id FROM sub", (dir_id,))]
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            marks = ",".join("?" * len(chunk))
            self._db.execute(f"DELETE FROM files WHERE dir IN ({marks})", chunk)
            self._db.execute(f"DELETE FROM dirs WHERE id IN ({marks})", chunk)

    def dir_of(self, path: str, *, create: bool = False) -> int | None:
        """The id of the folder holding ``path``."""
        dir_id = ROOT
        for name in path.split("/")[:-1]:
            got = self.child(dir_id, name)
            if got is None:
                if not create:
                    return None
                dir_id = self.ensure_dir(dir_id, name)
            else:
                dir_id = got[0]
        return dir_id

    def set_key(self, path: str, key: Key) -> None:
        """Record one file's key (a file fetched later by a lazy restore)."""
        dir_id = self.dir_of(path)
        if dir_id is not None:
            self.add_rows(dir_id, [(path.rpartition("/")[2], key)])

    # -- small blobs already in the store's packs (any version), for moved or copied files --

    def add_blobs(self, rows: Iterable[tuple[str, str, int, int]]) -> None:
        """Remember ``(blob hash, pack, offset, length)`` of blobs stored in packs."""
        ids: dict[str, int] = {}
        out = []
        for h, pack, off, n in rows:
            pid = ids.get(pack)
            if pid is None:
                self._db.execute("INSERT OR IGNORE INTO packs (hash) VALUES (?)", (pack,))
                pid = ids[pack] = self._db.execute("SELECT id FROM packs WHERE hash=?", (pack,)).fetchone()[0]
            out.append((bytes.fromhex(h), pid, off, n))
        out.sort()  # in key order: each page of the table is met once, not once a blob (a fifth quicker)
        self._db.executemany("INSERT OR REPLACE INTO blobs VALUES (?, ?, ?, ?)", out)

    def blob_reader(self) -> "BlobReader | None":
        """Look-ups of remembered blobs from any thread, seeing only what was committed; None
        when none is remembered (a first snapshot asks nothing)."""
        if self._db.execute("SELECT 1 FROM blobs LIMIT 1").fetchone() is None:
            return None
        return BlobReader(self.path)

    def signed_folders(self) -> list[tuple[str, int]]:
        """``(path, files)`` of each folder whose listing signature is kept ('' for the root;
        ``files``: those directly in it), in the order a walk meets them: each folder before
        its subfolders, names sorted. A folder whose path cannot be rebuilt is left out."""
        rows = self._db.execute("SELECT id, parent, name, files, sig IS NOT NULL FROM dirs").fetchall()
        by_id = {i: (parent, name, files or 0, signed) for i, parent, name, files, signed in rows}
        direct = {i: v[2] for i, v in by_id.items()}
        for i, (parent, _name, files, _s) in by_id.items():
            if i != ROOT and parent in direct:
                direct[parent] -= files  # ``files`` counts the whole subtree
        paths: dict[int, str | None] = {ROOT: ""}

        def path(i: int) -> str | None:
            chain: list[int] = []
            while i not in paths:
                if i not in by_id or len(chain) > len(by_id):
                    for j in chain:
                        paths[j] = None  # no root above it (or a loop): never walked from here
                    return None
                chain.append(i)
                i = by_id[i][0]
            at = paths[i]
            for j in reversed(chain):
                at = None if at is None else (f"{at}/{by_id[j][1]}" if at else by_id[j][1])
                paths[j] = at
            return at

        out = [(p, max(0, direct[i])) for i, v in by_id.items() if v[3] and (p := path(i)) is not None]
        out.sort(key=lambda pf: pf[0].split("/"))
        return out

    # -- the scrub's rotating order (engine/scrub) ---------------------------------------

    def set_meta(self, k: str, v: str | None) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (k, v))

    def rows_after(self, after: tuple[int, str], limit: int) -> list[tuple[int, str, Key]]:
        """Up to ``limit`` files after ``(folder id, name)`` in the table's own order."""
        return [(d, name, _key(*rest)) for d, name, *rest in self._db.execute(
            "SELECT dir, name, size, mtime, ctime, ino, target FROM files WHERE (dir, name) > (?, ?) "
            "ORDER BY dir, name LIMIT ?", (after[0], after[1], limit))]

    def path_of(self, dir_id: int) -> str | None:
        """A folder's path from the root ('' for it); None where it has no root above."""
        parts: list[str] = []
        at = dir_id
        for _ in range(4096):
            if at == ROOT:
                return "/".join(reversed(parts))
            row = self._db.execute("SELECT parent, name FROM dirs WHERE id=?", (at,)).fetchone()
            if row is None:
                return None
            parts.append(row[1])
            at = row[0]
        return None

    def forget_files(self, dir_id: int) -> None:
        """Make the next snapshot read every file of a folder again, and list the folders above
        it (journal snapshot or not): their rows unknown, their trees no longer the cached ones."""
        names = [r[0] for r in self._db.execute("SELECT name FROM files WHERE dir=?", (dir_id,))]
        self.replace_rows(dir_id, [(n, None) for n in names])
        at: int | None = dir_id
        for _ in range(4096):
            if at is None or at == 0:
                break
            self._db.execute("UPDATE dirs SET tree=NULL, sig=NULL WHERE id=?", (at,))
            row = self._db.execute("SELECT parent FROM dirs WHERE id=?", (at,)).fetchone()
            at = None if row is None else row[0]

    def count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM files").fetchone()[0])

    def all_rows(self) -> Iterator[tuple[int, str, Key]]:
        for dir_id, name, *rest in self._db.execute("SELECT dir, name, size, mtime, ctime, ino, target FROM files"):
            yield dir_id, name, _key(*rest)


class BlobReader:
    """Read-only look-ups in the ``blobs`` table, one connection per thread (committed rows only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def get(self, h: str) -> tuple[str, int, int] | None:
        """``(pack, offset, length)`` of blob ``h``, or None (also when the cache cannot be read)."""
        db = getattr(self._local, "db", None)
        try:
            if db is None:
                db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=1.0, check_same_thread=False)
                self._local.db = db
                with self._lock:
                    self._all.append(db)
            row = db.execute("SELECT p.hash, b.offset, b.length FROM blobs b JOIN packs p ON p.id = b.pack "
                             "WHERE b.hash=?", (bytes.fromhex(h),)).fetchone()
        except (sqlite3.Error, ValueError):
            return None  # only a cache: the blob is stored again
        return None if row is None else (row[0], row[1], row[2])

    def close(self) -> None:
        with self._lock:
            for db in self._all:
                db.close()
            self._all = []


class StatLike(Protocol):
    """What :func:`stat_key` reads: an ``os.stat_result``, or a walk's lighter copy of one."""

    @property
    def st_size(self) -> int: ...

    @property
    def st_mtime_ns(self) -> int: ...

    @property
    def st_ctime_ns(self) -> int: ...

    @property
    def st_ino(self) -> int: ...


def stat_key(st: StatLike) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def changed(was: Key, now: StatLike | str) -> bool:
    """Did this file change? The one answer the snapshot (and its helper processes) asks for:
    size, mtime, ctime and inode (DESIGN invariant 13).

    ``was`` is what is known of the file: its stat cache row against a fresh ``lstat`` (changed
    since the last version); the ``stat_key`` its listing saw against the ``fstat`` taken after
    it was read (changed while read: a same-size rewrite that puts the mtime back still moves
    the ctime; it is read again, then left for the next snapshot); or a symlink's recorded target
    against its target now. An unknown row (None) has always changed."""
    if isinstance(now, str) or isinstance(was, str):
        return was != now
    if was is None:
        return True
    return was != (now.st_size, now.st_mtime_ns, now.st_ctime_ns, now.st_ino)


def settled(key: Key, fresh_ns: int) -> Key:
    """``key`` as the row to keep, or None (unknown: the file is read again next time) for a file
    modified at ``fresh_ns`` or later: a write in the same clock tick as the snapshot's read would
    leave its size and mtime as recorded, and :func:`changed` would not see it."""
    if isinstance(key, tuple) and key[1] >= fresh_ns:
        return None
    return key
