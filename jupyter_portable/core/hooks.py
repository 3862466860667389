"""Named points in the write protocols where a test can step in.

The store's write steps (``step``), the Continue's recorded states (``entered_state``) and a
checkpoint's read-back (``before_readback``) call these. Nothing is installed outside tests, so
each call is a loop over an empty list. The crash-consistency tests install hooks (in the
processes they start: ``tests/hooks_site``) that kill the process at a chosen point or corrupt a
read-back; production code never imports them.
"""

from __future__ import annotations

from collections.abc import Callable

_steps: list[Callable[[str], None]] = []
_states: list[Callable[[str], None]] = []
_readbacks: list[Callable[[object, list[str]], None]] = []


def step(label: str) -> None:
    """One step of a store write (``label`` names it): a test may stop the process here."""
    for hook in _steps:
        hook(label)


def entered_state(state: str) -> None:
    """The lifecycle just recorded entering ``state`` (or the launch answered: ``LAUNCHED``)."""
    for hook in _states:
        hook(state)


def before_readback(store: object, keys: list[str]) -> None:
    """A checkpoint's objects ``keys`` were uploaded to ``store`` and are about to be read back."""
    for hook in _readbacks:
        hook(store, keys)


def install(*, step: Callable[[str], None] | None = None, entered_state: Callable[[str], None] | None = None,
            before_readback: Callable[[object, list[str]], None] | None = None) -> None:
    """Add hooks (tests only)."""
    if step is not None:
        _steps.append(step)
    if entered_state is not None:
        _states.append(entered_state)
    if before_readback is not None:
        _readbacks.append(before_readback)


__all__ = ["before_readback", "entered_state", "install", "step"]
