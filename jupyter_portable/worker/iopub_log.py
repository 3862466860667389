"""What the kernel published, kept on the machine for a user side that was cut off (issue 42).

The notebook's kernel publishes its output on IOPub, a ZeroMQ PUB socket: a message published
while the user side's SSH forward is down, or silent, reaches nobody, and ZeroMQ drops it. The
worker's iopub watcher (``worker/activity.py``) subscribes to the kernel on the machine's own
loopback, where no partition reaches, and hands every message it hears to an :class:`IOPubLog`:
the last :data:`MAX_MESSAGES` messages (at most :data:`MAX_BYTES` together), as the kernel sent
them (its frames and signature untouched), in the order it sent them.

``GET /kernel/iopub?after=<msg_id>`` answers the messages after that one; the user side asks when
its IOPub connects again (``worker/catchup.py``) and passes on those it has not seen.
"""

from __future__ import annotations

import base64
import collections
import threading
from typing import Any

MAX_MESSAGES = 2000
MAX_BYTES = 16 * 1024 * 1024


class IOPubLog:
    """A bounded, ordered record of one kernel's IOPub messages (thread-safe)."""

    def __init__(self, max_messages: int = MAX_MESSAGES, max_bytes: int = MAX_BYTES) -> None:
        self._lock = threading.Lock()
        self._messages: collections.deque[tuple[str, list[bytes], int]] = collections.deque()
        self._bytes = 0
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self.kernel = ""  # the kernel process the record is of (its iopub port); a new one starts afresh

    def follow(self, kernel: str) -> None:
        """Record the kernel ``kernel`` from now on: what another kernel published is forgotten."""
        with self._lock:
            if kernel != self.kernel:
                self._messages.clear()
                self._bytes = 0
                self.kernel = kernel

    def add(self, msg_id: str, frames: list[bytes]) -> None:
        """One message as it came off the socket (identities, delimiter, signature, parts)."""
        size = sum(len(f) for f in frames)
        if not msg_id or size > self._max_bytes:
            return
        with self._lock:
            self._messages.append((msg_id, frames, size))
            self._bytes += size
            while len(self._messages) > self._max_messages or self._bytes > self._max_bytes:
                self._bytes -= self._messages.popleft()[2]

    def after(self, msg_id: str) -> dict[str, Any]:
        """The answer of ``GET /kernel/iopub?after=``: ``found`` (whether ``msg_id`` is still kept;
        if not, ``messages`` is everything kept) and ``messages``, each ``{"msg_id", "frames"}``
        (base64), oldest first."""
        with self._lock:
            kept = list(self._messages)
        ids = [m[0] for m in kept]
        found = msg_id in ids
        start = len(ids) - ids[::-1].index(msg_id) if found else 0
        return {"kernel": self.kernel, "found": found,
                "messages": [{"msg_id": mid, "frames": [base64.b64encode(f).decode() for f in frames]}
                             for mid, frames, _ in kept[start:]]}


__all__ = ["MAX_BYTES", "MAX_MESSAGES", "IOPubLog"]
