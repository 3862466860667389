"""The one lock of the kernel's own store operations: a magic, a panel button and the
auto-snapshot never run a snapshot, a checkpoint or a restore at the same time."""

from __future__ import annotations

from jupyter_portable.engine.checkpoint.background import OPERATION_LOCK

# One workspace operation at a time per kernel: the auto-snapshot waits for a cell's, and the
# checkpoints uploading in the background take it too (the engine's lock, the same object).
# A checkpoint is registered without it: its upload, which takes it, may be waited for.
__all__ = ["OPERATION_LOCK"]
