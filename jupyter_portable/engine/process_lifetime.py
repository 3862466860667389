"""Processes that end with the process that started them, however it ends.

A helper pool's processes (``engine/hashproc.py``) and a notebook's placeholder kernel
(``interfaces/kernel/placeholder.py``) hold nothing of their own: left behind by a process
that was killed, they would hold its pipes, write to the workspace or answer a notebook for
a server that is gone.
"""

from __future__ import annotations

import os
import select
import threading
import time


def die_with(parent: int) -> None:
    """End this process (``os._exit``) when process ``parent`` ends, a SIGKILL included: a
    thread waits on the parent's pidfd. Ends it at once when ``parent`` is no longer this
    process's parent (it ended already)."""
    try:
        fd: int | None = os.pidfd_open(parent)
    except (AttributeError, OSError):  # not Linux 5.3 or later: ask for the parent every second
        fd = None
    if os.getppid() != parent:  # it ended already
        os._exit(0)
    threading.Thread(target=_end_with, args=(parent, fd), daemon=True, name="portable-die-with").start()


def _end_with(parent: int, fd: int | None) -> None:
    if fd is not None:
        select.select([fd], [], [])  # a process's pidfd is readable once it has ended
    else:
        while os.getppid() == parent:
            time.sleep(1.0)
    os._exit(0)
