"""Fault injection for the crash-consistency tests.

With ``JUPYTER_PORTABLE_KILL_AT=N`` in the environment, the Nth store write step of
this process SIGKILLs the process itself, mid-protocol, exactly as a lost machine
would stop. Unset (always, outside tests) every call is a cheap no-op.
"""

from __future__ import annotations

import os
import signal
import threading

_target = int(os.environ.get("JUPYTER_PORTABLE_KILL_AT", "0") or 0)
_count = 0
_lock = threading.Lock()


def corrupt_readback(store: object, keys: list[str]) -> None:
    """With ``JUPYTER_PORTABLE_CORRUPT_READBACK=1``, flip a byte of the first of ``keys``
    between upload and read-back, as a faulty store would (tests only)."""
    if os.environ.get("JUPYTER_PORTABLE_CORRUPT_READBACK") != "1" or not keys:
        return
    backend = store.backend  # type: ignore[attr-defined]
    data = bytearray(backend.read(keys[0]))
    if data:
        data[len(data) // 2] ^= 0xFF
        backend.write(keys[0], bytes(data))


def point(label: str) -> None:
    """Mark one step of a store write; die here if this is the chosen step."""
    global _count
    if not _target:
        return
    with _lock:
        _count += 1
        hit = _count == _target
    if hit:
        os.write(2, f"fault injection: SIGKILL at step {_target} ({label})\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)


_in_state = os.environ.get("JUPYTER_PORTABLE_KILL_IN_STATE", "")
_entered: dict[str, int] = {}


def entered_state(state: str) -> None:
    """With ``JUPYTER_PORTABLE_KILL_IN_STATE=STATE`` (or ``STATE:N``), SIGKILL this process just
    after it recorded entering STATE (the Nth time): a server dying mid-Continue (tests only)."""
    if not _in_state:
        return
    name, _, nth = _in_state.partition(":")
    if name != state:
        return
    with _lock:
        _entered[state] = _entered.get(state, 0) + 1
        hit = _entered[state] == int(nth or 1)
    if hit:
        os.write(2, f"fault injection: SIGKILL in {state}\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)
