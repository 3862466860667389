"""What the user's side and the serving worker last agreed on, file by file: the base a forwarded
save names (orchestration/monitor.py) and the follow loop keeps true (orchestration/follow.py)."""

from __future__ import annotations


class AgreedHashes(dict[str, str]):
    """path -> the hash the user's side and the serving worker last agreed on: the base a forwarded
    save names. It holds for one worker only: a new one starts from a version of its own, and what
    was agreed with the machine before it says nothing about what this one holds."""

    def __init__(self) -> None:
        super().__init__()
        self.allocation_id: str | None = None

    def switch(self, allocation_id: str | None) -> None:
        """Forget what was agreed with another worker than ``allocation_id``."""
        if allocation_id != self.allocation_id:
            self.clear()
            self.allocation_id = allocation_id


__all__ = ["AgreedHashes"]
