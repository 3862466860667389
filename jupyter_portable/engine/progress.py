"""Progress on stderr for long work: one updating line on a terminal, a line every few
seconds otherwise, nothing when quiet."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TextIO

# the one formatter of sizes, in the core so that the words every view shares can use it; re-exported
from jupyter_portable.core.units import human_bytes as human_bytes


class Progress:
    """Counters for one long operation, rendered by ``render`` at most every ``interval`` s.

    ``sink`` receives each rendered line (the magics send it to a cell; the CLI to stderr).
    """

    def __init__(self, label: str, *, sink: Callable[[str], None] | None = None,
                 stream: TextIO | None = None, interval: float | None = None) -> None:
        self.label = label
        self.stream = stream
        self.sink = sink
        tty = bool(stream is not None and stream.isatty())
        self.tty = tty
        self.interval = interval if interval is not None else (0.25 if tty or stream is None else 3.0)
        self.files_done = 0
        self.files_total = 0
        self.bytes_done = 0
        self.bytes_total = 0
        self.uploaded = 0
        self.stage = ""
        self._last = 0.0
        self._start = time.monotonic()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.stream is not None or self.sink is not None

    def add(self, files: int = 0, nbytes: int = 0, uploaded: int = 0) -> None:
        with self._lock:
            self.files_done += files
            self.bytes_done += nbytes
            self.uploaded += uploaded
        if self.enabled:
            self.tick()

    def set_stage(self, stage: str) -> None:
        self.stage = stage
        if self.enabled:
            self.tick(force=True)

    def line(self) -> str:
        pct = f" {100 * self.bytes_done / self.bytes_total:.0f}%" if self.bytes_total else ""
        up = f", {human_bytes(self.uploaded)} transferred" if self.uploaded else ""
        return (f"{self.label}: {self.stage} {self.files_done}/{self.files_total} files, "
                f"{human_bytes(self.bytes_done)}/{human_bytes(self.bytes_total)}{pct}{up}")

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.stream is not None and not self.tty and now - self._start < 2.0:
            return  # short work in a log needs no progress lines, only its summary
        if not force and now - self._last < self.interval:
            return
        self._last = now
        text = self.line()
        if self.sink is not None:
            self.sink(text)
        if self.stream is not None:
            if self.tty:
                self.stream.write("\r\033[K" + text)
            else:
                self.stream.write(text + "\n")
            self.stream.flush()

    def done(self, summary: str) -> None:
        if self.sink is not None:
            self.sink(summary)
        if self.stream is not None:
            if self.tty:
                self.stream.write("\r\033[K")
            self.stream.write(summary + "\n")
            self.stream.flush()
