"""The one exception tree of jupyter-portable.

Foreign errors (fsspec, botocore, OSError) are translated where they enter, with
``raise Mapped(...) from exc``; callers only ever see this tree::

    PortableError                  base; carries ``hint`` ("to fix: ...")
    ├── UsageError                 bad arguments or configuration
    ├── WorkspaceNotFound          no .portable/workspace.json here or above
    ├── StoreError                 the store could not be reached or read
    │   ├── ObjectMissing          a named object is not in the store
    │   └── UnsupportedStore       the URL's filesystem cannot do atomic publishing
    ├── ManifestError              a manifest or head failed validation
    │   └── UnsafePath             a path would escape the workspace directory
    ├── IntegrityError             bytes do not hash to what the record says
    ├── ConflictError              another writer moved the head first
    │   └── FencedError            this writer's allocation epoch is stale
    ├── VersionNotFound            the asked-for manifest version does not exist
    ├── ReservationNotFound        the workspace has no booking by that id
    └── ComputeError               a provider refused or failed; carries ``provider``
        ├── NoCapacity             listed, but none to be had now (zone exhausted, sold out)
        ├── QuotaExceeded          the account may not have more of this
        ├── AuthError              credentials missing, wrong or without permission
        ├── LaunchFailed           the launch was accepted and then failed
        ├── ProviderUnavailable    the provider's API could not be reached or answered badly
        ├── NotSupported           this provider does not offer that (e.g. reservations)
        └── AdmissionRefused       the machine is not what the requirements pin (an environment fault)
"""

from __future__ import annotations


class PortableError(Exception):
    """Base of every error this package raises on purpose."""

    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None, **context: object) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint
        self.context = context

    def one_line(self) -> str:
        """The message and, if any, the hint, on one line for stderr."""
        text = str(self).replace("\n", " ")
        return f"{text} (to fix: {self.hint})" if self.hint else text


class UsageError(PortableError):
    """Bad arguments or configuration."""


class WorkspaceNotFound(PortableError):
    hint = "run `jupyter portable init --store URL` here, or cd into a workspace"


class StoreError(PortableError):
    """The store could not be reached, listed, read or written."""


class ObjectMissing(StoreError):
    """An object named by a manifest or index is not in the store."""


class UnsupportedStore(StoreError):
    """The URL names a filesystem that cannot publish atomically."""


class ManifestError(PortableError):
    """A manifest, head or index failed validation."""


class UnsafePath(ManifestError):
    """A path from a manifest or request would escape the workspace directory."""


class IntegrityError(PortableError):
    """Bytes read do not hash to the value their record names."""


class ConflictError(PortableError):
    """Another writer published first; history stays linear."""


class FencedError(ConflictError):
    """This writer's allocation epoch is older than the head's: it may never publish."""


class VersionNotFound(PortableError):
    """No manifest with that version in the workspace's history."""


class ReservationNotFound(PortableError):
    """The workspace has no booking by that id."""


class ComputeError(PortableError):
    """A compute provider refused or failed. ``provider`` names it; ``offer`` where known."""

    def __init__(self, message: str, *, provider: str = "", offer: str | None = None,
                 hint: str | None = None, **context: object) -> None:
        super().__init__(message, hint=hint, **context)
        self.provider = provider
        self.offer = offer


class NoCapacity(ComputeError):
    """Listed, but there is none to be had right now."""

    hint = "try another route, or book a reservation"


class QuotaExceeded(ComputeError):
    """The account's quota does not allow this (quota never guarantees supply either)."""

    hint = "ask the provider for more quota, or pick another provider"


class AuthError(ComputeError):
    """Credentials are missing, wrong, or lack the permission."""


class LaunchFailed(ComputeError):
    """The provider accepted the launch, and then it failed."""


class ProviderUnavailable(ComputeError):
    """The provider's API could not be reached or answered with something unusable."""


class NotSupported(ComputeError):
    """This provider does not offer that operation."""


class AdmissionRefused(ComputeError):
    """The machine does not match the requirements: an environment fault, not the work's."""


__all__ = [
    "AdmissionRefused",
    "AuthError",
    "ComputeError",
    "ConflictError",
    "FencedError",
    "IntegrityError",
    "LaunchFailed",
    "ManifestError",
    "NoCapacity",
    "NotSupported",
    "ObjectMissing",
    "PortableError",
    "ProviderUnavailable",
    "QuotaExceeded",
    "ReservationNotFound",
    "StoreError",
    "UnsafePath",
    "UnsupportedStore",
    "UsageError",
    "VersionNotFound",
    "WorkspaceNotFound",
]
