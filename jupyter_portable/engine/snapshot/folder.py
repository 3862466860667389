"""A folder on its way through the snapshot: what the scanner found in it, what the file
saver was asked to read, and what the tree saver made of it."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from jupyter_portable.core.manifest import FileEntry
from jupyter_portable.engine.listing import Found
from jupyter_portable.engine.snapshot.uploader import Frag
from jupyter_portable.workdir.statcache import Key

Entry = dict[str, Any] | FileEntry  # a new entry (dict) or one kept from the base version


def entry_size(e: Entry) -> int:
    """The bytes of a file entry, new or kept."""
    return e.size if isinstance(e, FileEntry) else int(e.get("size", 0))


@dataclass
class Result:
    """What a folder became: its tree (None until written), and what it holds."""

    tree: str | None
    files: int
    bytes: int
    unchanged: bool  # exactly the tree the stat cache remembers


@dataclass
class Folder:
    rel: str
    abs: str
    name: str
    depth: int
    parent: Folder | None
    cache_id: int | None
    cached: tuple[str | None, int, int] | None
    rows: dict[str, Key]
    subdirs: list[tuple[str, str]]
    changed: bool = False
    next_sub: int = 0
    kept: dict[str, Entry] = field(default_factory=dict)
    keys: dict[str, Key] = field(default_factory=dict)
    maybe: list[tuple[Found, Key]] = field(default_factory=list)  # stat as cached: kept if the base has it
    jobs: list[Future[list[tuple[Found, Entry | None]]]] = field(default_factory=list)
    children: dict[str, Result] = field(default_factory=dict)
    entries: list[Entry | tuple[str, Result]] = field(default_factory=list)
    frag: Frag | None = None  # files a helper read and wrote the entries of (a first snapshot)
    result: Result | None = None
    quick: bool = False  # its files were vouched for by the listing's signature alone
    trusted: bool = False  # not looked at: the journal says nothing under it changed
    sig: bytes | None = None  # the listing's signature, kept with the rows when all are sound
    queued: int = 0  # files sent to be hashed and not yet taken
    unpacked: list[dict[str, Any]] | None = None  # its new entries waiting for a pack ref, once queued


