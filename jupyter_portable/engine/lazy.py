"""Lazy restore: large files fetched in the background, any file asked for first.

``restore --lazy`` leaves files above a threshold in ``.portable/pending.json`` and starts
``python -m jupyter_portable.engine.lazy DIR``. :func:`fetch_pending` is shared by that process
and by whoever asks for one file now (``jupyter portable fetch PATH``): a per-file lock
makes sure each file is fetched once, and the asker never waits behind the queue.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from jupyter_portable.core.errors import UsageError
from jupyter_portable.engine.fetch import already_there, fetch_large
from jupyter_portable.engine.gate import InboundGate, Refused
from jupyter_portable.engine.progress import Progress
from jupyter_portable.store.repo import Store
from jupyter_portable.workdir.pending import read_pending, write_pending
from jupyter_portable.workdir.statcache import stat_key
from jupyter_portable.workdir.workcopy import WorkspaceCopy


def pending_paths(copy: WorkspaceCopy) -> list[str]:
    return [e.path for e in read_pending(copy)[1]]


def fetch_pending(copy: WorkspaceCopy, path: str | None = None, progress: Progress | None = None,
                  inbound: InboundGate | None = None) -> str | None:
    """Fetch one pending file (``path``, or the smallest left); return its path or None. It is
    written through ``inbound`` (by default the user's side's gate, its rules as they stand now)."""
    _, entries = read_pending(copy)
    if path is not None:
        chosen = [e for e in entries if e.path == path]
        if not chosen:
            return None  # already fetched (or never pending)
    else:
        chosen = sorted(entries, key=lambda e: e.size)[:1]
        if not chosen:
            return None
    entry = chosen[0]
    gate = inbound or InboundGate.for_copy(copy.root)
    why = gate.reason(entry.path)
    if why is not None:
        # left pending by a restore before the gate, or the user's rules changed since: never
        # written, no longer pending, and said (the background fetcher goes on with the rest)
        _drop_pending(copy, entry.path)
        raise Refused(f"{entry.path}: not fetched: {why}")
    cfg = copy.read_config()
    store = Store.open(cfg.store)
    with copy.fetch_lock(entry.hash):
        version, entries = read_pending(copy)
        if entry.path not in {e.path for e in entries}:
            return entry.path  # another process placed it while we waited
        if not already_there(copy.root, entry):
            fetch_large(store, gate.placer(), entry, progress)
        with copy.pending_lock():
            version, entries = read_pending(copy)
            rest = [e for e in entries if e.path != entry.path]
            if rest:
                write_pending(copy, version, rest)
            else:
                copy.clear_pending()
            try:
                with copy.statcache() as cache:
                    if cache.valid_for(version):
                        cache.set_key(entry.path, stat_key(os.stat(copy.root / entry.path)))
            except sqlite3.Error:
                pass  # only a cache (a snapshot may hold it): the next snapshot reads the file again
    return entry.path


def _drop_pending(copy: WorkspaceCopy, path: str) -> None:
    with copy.pending_lock():
        version, entries = read_pending(copy)
        rest = [e for e in entries if e.path != path]
        if rest:
            write_pending(copy, version, rest)
        else:
            copy.clear_pending()


def ensure(copy: WorkspaceCopy, path: str, progress: Progress | None = None,
           inbound: InboundGate | None = None) -> None:
    """Make sure ``path`` is materialized, fetching it now if it is still pending (through ``inbound``)."""
    if path in pending_paths(copy):
        fetch_pending(copy, path, progress, inbound)
    elif not (copy.root / path).exists():
        raise UsageError(f"{path!r} is neither in this copy nor pending")


def start_background_fetch(root: Path) -> int:
    """Start the detached fetcher for ``root``; its log is ``.portable/lazy.log``."""
    log = WorkspaceCopy(root).open_fetcher_log()
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_portable.engine.lazy", str(root)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    log.close()
    return proc.pid


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    copy = WorkspaceCopy(Path(args[0]))
    with copy.fetcher_lock():  # one background fetcher per copy
        while True:
            try:
                done = fetch_pending(copy)
            except Refused as exc:  # refused by the inbound gate: dropped from the queue, said here
                print(f"refused {exc}", flush=True)
                continue
            if done is None:
                return 0
            print(f"fetched {done}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
