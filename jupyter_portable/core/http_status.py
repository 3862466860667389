"""Which HTTP status each of the package's errors becomes, and the body that says it: one table,
read by the server extension's handlers and the worker's alike.

A class not in the table takes the status of its nearest listed base. What the statuses say:

- 400: the request itself is wrong (bad arguments, a path that escapes, a bad manifest sent in);
- 404: what it names does not exist (no workspace here, no such version or booking);
- 409: the workspace refuses it now (another writer first, a Continue running, no capacity on
  the route, the machine refused by admission): trying again later, or another way, may work;
- 422: the provider does not offer that operation at all;
- 502: something this server relies on answered wrongly (the provider refused the server's own
  credentials; the store gave bytes that do not match their hash, or lost an object);
- 503: something this server relies on could not be reached (the provider's API, the store).

Anything that is not a PortableError stays a 500, with its traceback in the server's log. Every
error answer is :func:`error_answer`'s ``{"error", "hint"}`` (``serverext/schemas/error.json``).
"""

from __future__ import annotations

from typing import Any

from jupyter_portable.core.errors import (
    AdmissionRefused,
    AuthError,
    ComputeError,
    ConflictError,
    IntegrityError,
    LaunchFailed,
    ManifestError,
    NoCapacity,
    NotSupported,
    ObjectMissing,
    PortableError,
    ProviderUnavailable,
    QuotaExceeded,
    ReservationNotFound,
    StoreError,
    UnsupportedStore,
    UsageError,
    VersionNotFound,
    WorkspaceNotFound,
)

HTTP_STATUS: dict[type[PortableError], int] = {
    UsageError: 400,
    ManifestError: 400,  # UnsafePath with it
    UnsupportedStore: 400,  # the store URL the user gave cannot publish atomically
    WorkspaceNotFound: 404,
    VersionNotFound: 404,
    ReservationNotFound: 404,
    ConflictError: 409,  # FencedError with it
    ComputeError: 409,
    NoCapacity: 409,
    QuotaExceeded: 409,
    LaunchFailed: 409,
    AdmissionRefused: 409,
    NotSupported: 422,
    AuthError: 502,
    IntegrityError: 502,
    ObjectMissing: 502,
    ProviderUnavailable: 503,
    StoreError: 503,
    PortableError: 500,
}


def status_for(exc: BaseException) -> int | None:
    """The status ``exc`` becomes, or None for an error that is not the package's own."""
    for cls in type(exc).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]  # type: ignore[index]
    return None


def error_answer(exc: BaseException | None, fallback: str) -> dict[str, Any]:
    """The body of an error answer: the package's error with its hint apart, else ``fallback``
    (the framework's reason: "a valid token is required", "Not Found")."""
    if isinstance(exc, PortableError):
        return {"error": str(exc), "hint": exc.hint}
    return {"error": fallback, "hint": None}


__all__ = ["HTTP_STATUS", "error_answer", "status_for"]
