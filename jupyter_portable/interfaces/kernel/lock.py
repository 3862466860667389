"""The one lock of the kernel's own store operations: a magic, a panel button and the
auto-snapshot never run a snapshot, a checkpoint or a restore at the same time."""

from __future__ import annotations

import threading

# One workspace operation at a time per kernel: the auto-snapshot waits for a cell's.
OPERATION_LOCK = threading.RLock()
