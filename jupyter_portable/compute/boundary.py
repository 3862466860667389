"""Where a cloud library's errors become this package's: one context manager for every provider
that talks through a vendor's library (botocore for AWS, google-api-core for GCP).

Each provider names the library's error classes (imported late, so that importing a provider
stays cheap) and its one translation function; a call inside ``with boundary(what, offer)``
raises only :mod:`jupyter_portable.core.errors`' errors, the library's one chained as the cause.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from jupyter_portable.core.errors import ComputeError, ProviderUnavailable


class Translate(Protocol):
    def __call__(self, exc: Exception, *, what: str, offer: str | None,
                 default: type[ComputeError]) -> ComputeError: ...


class Boundary:
    """``with boundary("launch", offer.id, default=LaunchFailed): ...``: every error of the classes
    ``errors()`` names, raised inside, leaves as ``translate(exc, what=, offer=, default=)``.
    ``default`` is the error for what the translation does not recognise (ProviderUnavailable
    unless the caller says otherwise, e.g. LaunchFailed during a launch)."""

    def __init__(self, errors: Callable[[], tuple[type[Exception], ...]], translate: Translate) -> None:
        self._errors = errors
        self._translate = translate

    @contextmanager
    def __call__(self, what: str, offer: str | None = None,
                 default: type[ComputeError] = ProviderUnavailable) -> Iterator[None]:
        caught = self._errors()
        try:
            yield
        except caught as exc:
            raise self._translate(exc, what=what, offer=offer, default=default) from exc


__all__ = ["Boundary", "Translate"]
