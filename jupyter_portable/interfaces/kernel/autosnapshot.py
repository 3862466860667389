"""Auto-snapshot from the kernel: every N minutes in a background thread.

It never blocks a cell: it runs beside the kernel, and a file being written while it
reads is left for the next snapshot. A verified checkpoint (itself a snapshot) restarts
the timer. ``c.PortableKernel.autosnapshot_minutes`` (``JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES``) sets
the interval (default 10, 0 off; a bad value is refused, naming it).

While it runs, a change journal (``engine/journal``) watches the workspace where the kernel
runs (this computer, or the worker's machine), so an auto-snapshot (and ``%workspace
snapshot``) reads only what changed. The whole tree is still walked on a schedule,
``c.PortableKernel.full_walk_minutes`` (default 60; 0: only when the journal cannot be
trusted), and a stop's final version always comes from a full walk (worker/agent.seal).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

from jupyter_portable.core.envconfig import PortableKernel
from jupyter_portable.interfaces.kernel.lock import OPERATION_LOCK

if TYPE_CHECKING:
    from jupyter_portable.engine.journal import ChangeJournal, Cut
    from jupyter_portable.engine.snapshot import SnapshotResult



class _State:
    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.reset = threading.Event()
        self.minutes = 0.0
        self.root: str | None = None
        self.last_version: int | None = None
        self.last_time: float | None = None
        self.last_error: str | None = None
        self.runs = 0
        self.journal: ChangeJournal | None = None
        self.journal_off: str | None = None  # why there is no journal
        self.last_walk: str | None = None  # how the last snapshot (auto or by hand) walked: SnapshotResult.walk_note
        self.folders: int | None = None  # folders the last full walk found (watched ones are counted against it)
        self.last_scrub: str | None = None  # what the scrub after the last auto-snapshot read and found


STATE = _State()


def default_minutes() -> float:
    """``c.PortableKernel.autosnapshot_minutes`` (``JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES``): a bad
    value is a UsageError naming it, never the default in its place."""
    return float(PortableKernel.current().autosnapshot_minutes)


def scrub_least_bytes() -> int:
    """``c.PortableKernel.scrub_mb`` (``JUPYTER_PORTABLE_SCRUB_MB``) in bytes: what the scrub after each
    auto-snapshot reads at least (more where a day of runs would not read every file once; 0: off)."""
    return int(PortableKernel.current().scrub_mb * 1024 * 1024)


def full_walk_minutes() -> float:
    """``c.PortableKernel.full_walk_minutes`` (``JUPYTER_PORTABLE_FULL_WALK_MINUTES``)."""
    return float(PortableKernel.current().full_walk_minutes)


def _start_journal(state: _State) -> None:
    from jupyter_portable.core.errors import PortableError
    from jupyter_portable.engine.journal import ChangeJournal
    from jupyter_portable.engine.workspace import Workspace

    try:
        journal = ChangeJournal(Workspace.find(state.root or ".").copy.root, full_every_s=full_walk_minutes() * 60)
        journal.start()
    except (ImportError, OSError, PortableError) as exc:
        state.journal_off = str(exc)  # every snapshot walks the tree, as without a journal
        return
    state.journal, state.journal_off = journal, None


def journal_cut() -> Cut | None:
    """A cut of the kernel's change journal for a snapshot about to run (hold OPERATION_LOCK
    from the cut to the end of the snapshot); None where no journal runs."""
    journal = STATE.journal
    return None if journal is None else journal.cut(now=time.monotonic())


def record_walk(result: SnapshotResult, state: _State | None = None) -> None:
    """Remember how a snapshot that took a journal cut walked (every snapshot of this kernel)."""
    state = state or STATE
    state.last_walk = result.walk_note
    if result.walk == "full" and result.folders:
        state.folders = result.folders


def _loop(state: _State, stop: threading.Event) -> None:
    from jupyter_portable.engine.workspace import Workspace

    _start_journal(state)
    while not stop.is_set():
        state.reset.clear()
        deadline = time.monotonic() + state.minutes * 60
        while time.monotonic() < deadline and not stop.is_set():
            if state.reset.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic()))):
                deadline = time.monotonic() + state.minutes * 60
                state.reset.clear()
        if stop.is_set():
            return
        try:
            with OPERATION_LOCK:
                result = Workspace.find(state.root or ".").snapshot("auto-snapshot", progress=None,
                                                                    journal=journal_cut())
            record_walk(result, state)
            state.last_error = None
            state.last_time = time.time()
            state.last_version = result.version  # last: what waits for a version sees the rest
        except Exception as exc:  # noqa: BLE001 - shown in status; the kernel must go on
            state.last_error = f"{type(exc).__name__}: {exc}"
            state.last_time = time.time()
            result = None
        state.runs += 1
        if result is not None:
            try:
                _scrub(state, result.bytes, result.files)
            except Exception as exc:  # noqa: BLE001 - shown in status; the next run scrubs on
                state.last_scrub = f"failed: {type(exc).__name__}: {exc}"


def _scrub(state: _State, total_bytes: int, total_files: int) -> None:
    """Re-hash a rotating sample of unchanged files (engine/scrub): each at least once a day."""
    import sys

    from jupyter_portable.engine.scrub import budget_for, files_for
    from jupyter_portable.engine.workspace import Workspace

    least = scrub_least_bytes()
    if least <= 0:
        return
    with OPERATION_LOCK:
        every_s = state.minutes * 60
        got = Workspace.find(state.root or ".").scrub(budget_for(total_bytes, every_s, least),
                                                      files_for(total_files, every_s))
    state.last_scrub = f"re-read {got.files} unchanged files"
    for text in got.warnings():
        print(f"warning: {text}", file=sys.stderr)
    if got.mismatched:
        state.last_scrub += f", {len(got.mismatched)} changed unseen by stat: {', '.join(got.mismatched[:3])}"


def start(shell: Any, minutes: float) -> None:
    """(Re)start the timer with ``minutes`` (0 turns it off)."""
    stop_now()
    STATE.minutes = minutes
    STATE.root = os.getcwd()
    if minutes <= 0:
        return
    STATE.stop = threading.Event()
    STATE.thread = threading.Thread(target=_loop, args=(STATE, STATE.stop), name="portable-autosnapshot",
                                    daemon=True)
    STATE.thread.start()


def stop_now() -> None:
    STATE.stop.set()
    if STATE.thread is not None:
        STATE.thread.join(timeout=5)
    STATE.thread = None
    if STATE.journal is not None:
        STATE.journal.close()
        STATE.journal = None


def checkpoint_verified() -> None:
    """A verified checkpoint just published everything: start the interval again."""
    STATE.reset.set()


def describe() -> str:
    if STATE.minutes <= 0 or STATE.thread is None:
        return "auto-snapshot is off"
    text = f"auto-snapshot every {STATE.minutes:g} min"
    if STATE.last_time is not None:
        ago = time.time() - STATE.last_time
        text += f"; last {ago:.0f} s ago" + (f" (version {STATE.last_version})" if STATE.last_version else "")
    if STATE.last_error:
        text += f"; last attempt failed: {STATE.last_error}"
    if STATE.journal is not None:
        of = f" of {STATE.folders} found by the last full walk" if STATE.folders is not None else ""
        text += f"; change journal on ({STATE.journal.watches} folders watched{of})"
    elif STATE.journal_off:
        text += f"; change journal off: {STATE.journal_off}"
    if STATE.last_walk:
        text += f"; last walk: {STATE.last_walk}"
    if STATE.last_scrub:
        text += f"; scrub: {STATE.last_scrub}"
    return text


def info() -> dict[str, Any]:
    return {"minutes": STATE.minutes if STATE.thread is not None else 0, "runs": STATE.runs,
            "last_version": STATE.last_version, "last_error": STATE.last_error,
            "journal": STATE.journal is not None, "journal_off": STATE.journal_off, "last_walk": STATE.last_walk,
            "watched": STATE.journal.watches if STATE.journal is not None else None, "folders": STATE.folders}
