"""What every remote backend shares: conditional writes that tell a lost race from a
retried request, and the probe that refuses a service which ignores the conditions.

A backend here implements ``_put(key, data, cond)`` where ``cond`` is ``NEW`` (create
only), a version token (replace only that version) or ``None`` (unconditional), and
raises :class:`Refused` when the service answered that the condition did not hold.
"""

from __future__ import annotations

import secrets
from typing import Final

from jupyter_portable.core import hooks
from jupyter_portable.core.errors import ConflictError, ObjectMissing, StoreError, UnsupportedStore
from jupyter_portable.store.backend import Backend

NEW: Final = "\x00new"  # the condition "only if the key does not exist"
PROBE_PREFIX = "probe"


class Refused(Exception):
    """The service refused a conditional write: the condition did not hold (a 412 or 409)."""


class RemoteBackend(Backend):
    """A backend on an object service whose own conditional writes give create-only and CAS."""

    #: the service's words for its two conditions, named in the error when one is missing
    create_only_condition = "create-only writes"
    swap_condition = "compare-and-swap writes"
    _probed = False
    _bucket_seen = False
    url = ""

    def _put(self, key: str, data: bytes, cond: str | None) -> None:
        raise NotImplementedError

    def _bucket_exists(self) -> bool | None:
        """Whether the bucket (or container) itself is there; None where that cannot be asked."""
        return None

    def _missing(self, key: str) -> ObjectMissing:
        """The error for a key the service says is not there. Most services answer a missing
        bucket with the same 404 as a missing object: a gone bucket would read as an empty
        workspace. The first miss asks after the bucket (once it is seen, never again) and
        a missing bucket is the store's error, said as such."""
        self._check_bucket()
        return ObjectMissing(f"object {key} is missing from {self.url}", key=key)

    def _check_bucket(self) -> None:
        """Raise StoreError if the store's bucket does not exist (asked until it is seen)."""
        if self._bucket_seen:
            return
        if self._bucket_exists() is False:
            raise StoreError(f"the bucket of {self.url} does not exist",
                             hint="check the store URL's bucket name, or create the bucket first")
        self._bucket_seen = True

    def _holds(self, key: str, data: bytes) -> bool | None:
        """Whether ``key`` holds exactly ``data``; None if that cannot be read."""
        try:
            return self.read(key) == data
        except ObjectMissing:
            return False
        except StoreError:
            return None

    def _conditional(self, key: str, data: bytes, cond: str) -> None:
        hooks.step(f"conditional put {key}")
        try:
            self._put(key, data, cond)
        except (Refused, StoreError) as exc:
            # A refusal of a retried request, a 5xx or a reset may all come after the
            # service applied the first try: the key itself says whether the write landed.
            landed = self._holds(key, data)
            if landed:
                return
            if landed is None:
                raise StoreError(f"cannot tell whether {key} was written to {self.url}: the write failed "
                                 f"({exc}) and reading it back failed too",
                                 hint="run the same command again: it finds out which") from exc
            if isinstance(exc, Refused):
                raise ConflictError(f"{key} changed under us in {self.url}", key=key) from exc
            raise
        hooks.step(f"conditional put done {key}")

    def write(self, key: str, data: bytes) -> None:
        hooks.step(f"put {key}")
        self._put(key, data, None)
        hooks.step(f"put done {key}")

    def write_new(self, key: str, data: bytes) -> None:
        self._conditional(key, data, NEW)

    def swap(self, key: str, data: bytes, token: str | None) -> None:
        if token is None:  # a new workspace (init) or document: before its first head
            self.check_conditional_writes()
        self._conditional(key, data, NEW if token is None else token)

    def check_conditional_writes(self) -> None:
        """Prove once that the service refuses a second create-only write and a swap with a
        stale token; :class:`UnsupportedStore` naming the missing condition otherwise."""
        if self._probed:
            return
        key = f"{PROBE_PREFIX}/{secrets.token_hex(8)}"
        hint = ("use a service that implements conditional writes (the README lists them), "
                "or a file:// store")
        try:  # the probe's own deletes are best effort: a leftover probe/ key is ignored by readers
            self._probe_put(key, b"probe 1", NEW, self.create_only_condition, hint)
            if not self._probe_refused(key, b"probe 2", NEW, self.create_only_condition, hint):
                raise UnsupportedStore(f"{self.url} ignores {self.create_only_condition}: a second "
                                       "create-only write replaced the first, so two writers could both "
                                       "publish the same version", hint=hint)
            got = self.read_versioned(key)
            if got is None or got[0] != b"probe 1":
                raise UnsupportedStore(f"{self.url} does not read back what it stored under {key}", hint=hint)
            self._probe_put(key, b"probe 3", got[1], self.swap_condition, hint)
            if not self._probe_refused(key, b"probe 4", got[1], self.swap_condition, hint):
                raise UnsupportedStore(f"{self.url} ignores {self.swap_condition}: a write based on a stale "
                                       "version replaced a newer one, so a lost race could move the head",
                                       hint=hint)
        finally:
            try:
                self.delete(key)
            except StoreError:
                pass
        self._probed = True

    def _probe_put(self, key: str, data: bytes, cond: str, what: str, hint: str) -> None:
        try:
            self._put(key, data, cond)
        except Refused as exc:
            if self._holds(key, data):
                return  # a retried request whose first try landed
            raise UnsupportedStore(f"{self.url} refused a write with {what} whose condition held",
                                   hint=hint) from exc
        except StoreError as exc:
            raise _unsupported(exc, self.url, what, hint) from exc

    def _probe_refused(self, key: str, data: bytes, cond: str, what: str, hint: str) -> bool:
        try:
            self._put(key, data, cond)
        except Refused:
            return True
        except StoreError as exc:
            raise _unsupported(exc, self.url, what, hint) from exc
        return False


def _unsupported(exc: StoreError, url: str, what: str, hint: str) -> StoreError:
    """A service that answers "not implemented" to a condition lacks it; any other failure
    (a 5xx, a reset) is the store's error as it is, for the user to retry."""
    text = str(exc)
    if any(code in text for code in ("NotImplemented", "501", "InvalidArgument", "InvalidRequest")):
        return UnsupportedStore(f"{url} does not implement {what}: {text}", hint=hint)
    return exc
