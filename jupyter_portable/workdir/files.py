"""State files written whole or not at all, and exclusive locks across processes: the one way
this package writes its state (a copy's ``.portable/``, the local market's and the ssh
provider's tables).

A write goes to a temporary name beside the file, is fsync'ed, then renamed over it, so a
reader sees the old bytes or the new ones, never a mix. A lock is ``flock`` on a separate
lock file: the kernel drops it when its holder dies, so a crash never leaves it held."""

from __future__ import annotations

import fcntl
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from jupyter_portable.core.errors import ConflictError


@contextmanager
def atomic_open(path: Path, mode: int = 0o666) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content into; it replaces ``path`` only when the
    block ends without error (``mode``, before the umask, from the first byte)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: Path, data: bytes, mode: int = 0o666) -> None:
    """Write ``data`` to ``path`` whole or not at all; ``mode`` (before the umask) from the first byte."""
    with atomic_open(path, mode) as fh:
        fh.write(data)


@contextmanager
def file_lock(path: Path, *, wait_s: float | None = None, busy: str | None = None, hint: str | None = None,
              mode: int = 0o600, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> Iterator[None]:
    """Hold an exclusive lock on the lock file ``path`` (made with ``mode`` if missing) for the block.

    ``wait_s`` None waits as long as it takes; a number gives up after that many seconds (0:
    at once) with ConflictError(``busy``, ``hint``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    try:
        if wait_s is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            deadline = clock() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if clock() >= deadline:
                        raise ConflictError(busy or f"another process holds {path}",
                                            hint=hint or "wait for it to finish") from None
                    sleep(0.005)
        yield
    finally:
        os.close(fd)  # closing the descriptor drops the lock


__all__ = ["atomic_open", "atomic_write", "file_lock"]
