"""Fault injection for the crash-consistency tests, installed into jupyter_portable.core.hooks
by ``sitecustomize`` in the processes a test starts with :func:`fault_env`'s environment.

With ``JUPYTER_PORTABLE_KILL_AT=N`` in the environment, the Nth store write step of
this process SIGKILLs the process itself, mid-protocol, exactly as a lost machine
would stop; ``JUPYTER_PORTABLE_KILL_IN_STATE`` kills it after the lifecycle recorded a state;
``JUPYTER_PORTABLE_CORRUPT_READBACK=1`` corrupts a checkpoint between upload and read-back.
"""

from __future__ import annotations

import os
import signal
import threading

_target = int(os.environ.get("JUPYTER_PORTABLE_KILL_AT", "0") or 0)
_count = 0
_lock = threading.Lock()
_corrupted: set[str] = set()


def corrupt_readback(store: object, keys: list[str]) -> None:
    """With ``JUPYTER_PORTABLE_CORRUPT_READBACK=1``, flip a byte of the first of ``keys``
    between upload and read-back, as a faulty store would (tests only)."""
    if os.environ.get("JUPYTER_PORTABLE_CORRUPT_READBACK") != "1" or not keys:
        return
    with _lock:
        if keys[0] in _corrupted:  # once: the read-back of a part as it goes up, then again at the end
            return
        _corrupted.add(keys[0])
    backend = store.backend  # type: ignore[attr-defined]
    data = bytearray(backend.read(keys[0]))
    if data:
        data[len(data) // 2] ^= 0xFF
        backend.write(keys[0], bytes(data))


def point(label: str) -> None:  # core.hooks.step
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


HOOKS_SITE = os.path.dirname(os.path.abspath(__file__))


def install() -> None:
    """Put these faults into jupyter_portable.core.hooks (this process only)."""
    from jupyter_portable.core import hooks

    hooks.install(step=point, entered_state=entered_state, before_readback=corrupt_readback)


def fault_env(base: dict[str, str] | None = None, **faults: str) -> dict[str, str]:
    """An environment for a process a test starts that installs these faults at start-up (this
    folder's ``sitecustomize``), with ``faults`` (``JUPYTER_PORTABLE_KILL_AT="3"``, ...) set."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HOOKS_SITE, env.get("PYTHONPATH")) if p)
    env.update(faults)
    return env
