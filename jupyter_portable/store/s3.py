"""S3 (and S3-compatible: MinIO, R2, moto) through s3fs, with conditional writes.

Configuration is the usual AWS one, read by botocore: profiles (``AWS_PROFILE``),
``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``
and the credential chain. Nothing here reads or logs a secret.

The content-addressed objects (``objects/``: packs, parts, trees), which carry nearly all the
bytes, go through a plain botocore client used from many threads at once (each request on a
thread of its own, the socket I/O outside the interpreter lock), not through s3fs's one
event-loop thread: on two cores that thread was the upload's and the read-back's bottleneck
(``bench/README.md``, issue 44). Everything else (manifests, the head, conditional writes)
stays on s3fs.
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from jupyter_portable.core import hooks
from jupyter_portable.core.errors import ConflictError, StoreError
from jupyter_portable.store.remote import NEW, Refused, RemoteBackend

_CONFLICT_CODES = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")
_MISSING_CODES = ("NoSuchKey", "404", "NotFound")
_DENIED_CODES = ("AccessDenied", "403", "Forbidden")
OBJECTS = "objects/"  # content-addressed keys: every reader hashes what it reads (invariant 4)
DATA_CONNECTIONS = 32  # the objects client's connection pool: the upload and read-back pools at once
TRIES = 5  # an objects request broken off (a reset, a short body, a SlowDown) is tried this often, as s3fs does
_SLOW = ("SlowDown", "reduce your request rate")
PIECE = 1 << 20  # a held part's body is sent, and a read-back streamed, this much at a time


class _HeldBody(io.BytesIO):
    """A part's body that calls ``hold`` before each piece botocore takes of it (to sign the
    payload, then to send it): a pause takes hold within a request already on its way. Each
    piece is at least ``PIECE`` bytes, whatever the reader asks for (http.client asks for 16 KiB)."""

    def __init__(self, data: bytes, hold: Callable[[], None]) -> None:
        super().__init__(data)
        self._hold = hold

    def read(self, size: int | None = -1, /) -> bytes:
        self._hold()
        return super().read(size if size is None or size < 0 else max(size, PIECE))


def _code(exc: BaseException) -> str:
    """The S3 error code behind an s3fs/botocore exception, or ''."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            return str(response.get("Error", {}).get("Code", ""))
        seen = seen.__cause__ or seen.__context__
    return str(exc)


def s3_location(environ: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """Where an s3:// store is, as botocore's configuration says: ``(region, "aws")``, or
    ``(region, None)`` for another endpoint (MinIO, R2, moto), whose provider is not AWS's."""
    env = os.environ if environ is None else environ
    custom = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    return region, None if custom else "aws"


class S3Backend(RemoteBackend):
    """Objects under ``s3://bucket/prefix``."""

    create_only_condition = "conditional writes (PutObject with If-None-Match: *)"
    swap_condition = "conditional writes (PutObject with If-Match: <ETag>)"

    def __init__(self, bucket: str, prefix: str) -> None:
        import s3fs  # heavy: only when an s3:// store is used

        if not bucket:
            raise StoreError("an s3:// store URL needs a bucket: s3://BUCKET/PREFIX")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.fs = s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True)
        self._data_lock = threading.Lock()
        self._data_for: Any = None  # the s3fs filesystem the objects client was made like
        self._data_client: Any = None

    def _bucket_exists(self) -> bool | None:
        try:
            self.fs.call_s3("head_bucket", Bucket=self.bucket)
        except FileNotFoundError:
            return False
        except Exception:  # noqa: BLE001 - cannot tell (no rights to ask, say): the key's own error stands
            return None
        return True

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _path(self, key: str) -> str:
        return f"{self.bucket}/{self._key(key)}"

    def _fail(self, what: str, key: str, exc: BaseException) -> StoreError:
        code = _code(exc) if getattr(exc, "response", None) is not None else ""
        if isinstance(exc, FileNotFoundError) or code in _MISSING_CODES:
            return self._missing(key)
        if isinstance(exc, PermissionError) or code in _DENIED_CODES:
            return StoreError(f"access denied to {key} in {self.url}",
                              hint="check AWS_PROFILE / credentials and the bucket policy")
        return StoreError(f"cannot {what} {key} in {self.url}: {type(exc).__name__}: {_code(exc)}")

    def _call(self, method: str, **kwargs: Any) -> Any:
        return self.fs.call_s3(method, Bucket=self.bucket, **kwargs)

    def _objects(self) -> Any:
        """The botocore client for ``objects/`` keys, made like ``self.fs`` (its endpoint, the same
        configuration chain), again whenever ``self.fs`` is replaced. Thread-safe once made.

        Its own checksums are asked for per request (``_put_object``): botocore's default CRC32
        of every body, and its validation on reads, are off, because every reader of an object
        hashes it against its name (invariant 4)."""
        with self._data_lock:
            if self._data_client is None or self._data_for is not self.fs:
                import botocore.session
                from botocore.config import Config
                from botocore.handlers import add_expect_header

                endpoint = getattr(self.fs, "endpoint_url", None) or (
                    getattr(self.fs, "client_kwargs", None) or {}).get("endpoint_url")
                client = botocore.session.Session().create_client(
                    "s3", endpoint_url=endpoint, config=Config(
                        max_pool_connections=DATA_CONNECTIONS, request_checksum_calculation="when_required",
                        response_checksum_validation="when_required"))
                # a body botocore reads (a held part's) would otherwise wait for a 100 Continue
                # first; every part's HEAD has already asked whether the store has it
                client.meta.events.unregister("before-call.s3", add_expect_header)
                self._data_client, self._data_for = client, self.fs
            return self._data_client

    def _retried(self, call: Callable[[], Any]) -> Any:
        """``call`` (a request of the objects client), tried again on a broken connection, a body
        cut short or a SlowDown, as s3fs does around botocore's own retries for the other keys."""
        for attempt in range(TRIES):
            try:
                return call()
            except Exception as exc:  # noqa: BLE001 - only what _retry_after says is passing is tried again
                self._retry_after(exc, attempt)
        raise AssertionError("unreachable")

    @staticmethod
    def _retry_after(exc: Exception, attempt: int) -> None:
        """Re-raise ``exc`` unless it is passing (a broken connection, a body cut short, a
        SlowDown) and ``attempt`` is not the last; else wait before the next try."""
        from botocore.exceptions import (
            ClientError,
            ConnectionError,
            HTTPClientError,
            IncompleteReadError,
            ResponseStreamingError,
        )

        if not isinstance(exc, (ConnectionError, HTTPClientError, IncompleteReadError, ResponseStreamingError,
                                ClientError)):
            raise exc
        slow = isinstance(exc, ClientError) and any(w in str(exc) for w in _SLOW)
        if attempt == TRIES - 1 or (isinstance(exc, ClientError) and not slow):
            raise exc
        time.sleep(min(1.7 ** attempt * 0.1, 15.0))

    def _get(self, key: str, byte_range: str | None = None) -> bytes:
        """One GET of an ``objects/`` key (``byte_range``: an HTTP Range), its body read whole."""
        extra = {} if byte_range is None else {"Range": byte_range}

        def get() -> bytes:
            body = self._objects().get_object(Bucket=self.bucket, Key=self._key(key), **extra)["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()

        return bytes(self._retried(get))

    def read_pieces(self, key: str, hold: Callable[[], None] | None = None) -> Iterator[bytes]:
        """An ``objects/`` key streamed in pieces of ``PIECE`` bytes, ``hold`` called before each:
        while it waits, the service's send waits on the connection (no CPU taken on either side).
        A stream broken off is taken up again from the first byte not yet given (a Range)."""
        if not key.startswith(OBJECTS):
            yield from super().read_pieces(key, hold)
            return
        got = 0
        for attempt in range(TRIES):
            try:
                if hold is not None:
                    hold()
                extra = {"Range": f"bytes={got}-"} if got else {}
                body = self._objects().get_object(Bucket=self.bucket, Key=self._key(key), **extra)["Body"]
                try:
                    for piece in body.iter_chunks(PIECE):
                        got += len(piece)
                        yield piece
                        if hold is not None:
                            hold()
                finally:
                    body.close()
                return
            except Exception as exc:  # noqa: BLE001 - translated at the boundary
                try:
                    self._retry_after(exc, attempt)
                except Exception as final:  # noqa: BLE001
                    raise self._fail("read", key, final) from final

    def read(self, key: str) -> bytes:
        try:
            if key.startswith(OBJECTS):
                return self._get(key)
            return self.fs.cat_file(self._path(key))
        except Exception as exc:  # noqa: BLE001 - translated at the boundary
            raise self._fail("read", key, exc) from exc

    def read_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            if not self.exists(key):
                raise self._missing(key)
            return b""
        try:
            if key.startswith(OBJECTS):
                return self._get(key, f"bytes={start}-{end - 1}")
            return self.fs.cat_file(self._path(key), start=start, end=end)
        except Exception as exc:  # noqa: BLE001
            if not isinstance(exc, FileNotFoundError) and _code(exc) == "InvalidRange":
                return b""  # a range wholly past the end, as a file read gives
            raise self._fail("read", key, exc) from exc

    def _head(self, key: str) -> dict | None:
        try:
            if key.startswith(OBJECTS):
                return dict(self._retried(lambda: self._objects().head_object(Bucket=self.bucket, Key=self._key(key))))
            return self._call("head_object", Key=self._key(key))
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, FileNotFoundError) or _code(exc) in _MISSING_CODES:
                self._check_bucket()
                return None
            raise self._fail("stat", key, exc) from exc

    def exists(self, key: str) -> bool:
        return self._head(key) is not None

    def size(self, key: str) -> int:
        head = self._head(key)
        if head is None:
            raise self._missing(key)
        return int(head["ContentLength"])

    def write(self, key: str, data: bytes) -> None:
        hooks.step(f"put {key}")
        try:
            self._call("put_object", Key=self._key(key), Body=data)
        except Exception as exc:  # noqa: BLE001
            raise self._fail("write", key, exc) from exc
        hooks.step(f"put done {key}")

    def write_blob(self, key: str, data: bytes) -> None:
        self._write_blob(key, data, checksum=True)

    def write_part(self, key: str, data: bytes, hold: Callable[[], None] | None = None) -> None:
        # read back and hashed against its name by the caller: S3's own CRC32 of the body would
        # only say again what that read-back says (and costs a pass over the bytes)
        self._write_blob(key, data, checksum=False, hold=hold)

    def _write_blob(self, key: str, data: bytes, *, checksum: bool, hold: Callable[[], None] | None = None) -> None:
        # Create only: a worker's session policy allows a PutObject on a shared key only with
        # If-None-Match, so that no worker can replace what other workspaces share.
        hooks.step(f"put {key}")
        try:
            if key.startswith(OBJECTS):
                crc = {"ChecksumAlgorithm": "CRC32"} if checksum else {}

                def put() -> Any:
                    body = data if hold is None else _HeldBody(data, hold)
                    return self._objects().put_object(Bucket=self.bucket, Key=self._key(key), Body=body,
                                                      IfNoneMatch="*", **crc)

                self._retried(put)
            else:
                self._call("put_object", Key=self._key(key), Body=data, IfNoneMatch="*")
        except Exception as exc:  # noqa: BLE001
            if not (isinstance(exc, FileExistsError) or any(c in _code(exc) for c in _CONFLICT_CODES)):
                raise self._fail("write", key, exc) from exc
            # refused: the object is there (its name is its hash), or another write of it is
            # in flight (a 409), which the key tells
            if not self.exists(key):
                raise StoreError(f"cannot write {key} to {self.url}: a concurrent write of it did not land "
                                 f"({_code(exc)})", hint="run the same command again") from exc
        hooks.step(f"put done {key}")

    def write_blobs(self, items: list[tuple[str, bytes]]) -> None:
        for key, data in items:
            self.write_blob(key, data)

    def _conditional_put(self, key: str, data: bytes, **cond: str) -> None:
        hooks.step(f"conditional put {key}")
        try:
            self._call("put_object", Key=self._key(key), Body=data, **cond)
        except Exception as exc:  # noqa: BLE001
            # A 412 on a retried request, a 500 or a reset may all come after S3 applied
            # the first try: the key itself says whether the write landed.
            landed = self._holds(key, data)
            if landed:
                return
            code = _code(exc)
            if landed is False and (isinstance(exc, FileExistsError) or any(c in code for c in _CONFLICT_CODES)):
                raise ConflictError(f"{key} changed under us in {self.url}", key=key) from exc
            if landed is None:
                raise StoreError(f"cannot tell whether {key} was written to {self.url}: the write failed "
                                 f"({type(exc).__name__}: {code}) and reading it back failed too",
                                 hint="run the same command again: it finds out which") from exc
            raise self._fail("write", key, exc) from exc
        hooks.step(f"conditional put done {key}")

    def _holds(self, key: str, data: bytes) -> bool | None:
        """Whether ``key`` holds exactly ``data``; None if that cannot be read."""
        try:
            return bool(self.fs.cat_file(self._path(key)) == data)
        except FileNotFoundError:
            return False
        except Exception:  # noqa: BLE001 - the caller reports the write's own failure
            return None

    def _put(self, key: str, data: bytes, cond: str | None) -> None:
        """One PutObject, for the probe: :class:`Refused` on a 412/409."""
        extra = {} if cond is None else {"IfNoneMatch": "*"} if cond == NEW else {"IfMatch": cond}
        try:
            self._call("put_object", Key=self._key(key), Body=data, **extra)
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, FileExistsError) or any(c in _code(exc) for c in _CONFLICT_CODES):
                raise Refused(_code(exc)) from exc
            raise self._fail("write", key, exc) from exc

    def write_new(self, key: str, data: bytes) -> None:
        self._conditional_put(key, data, IfNoneMatch="*")

    def durability_warnings(self) -> list[str]:
        """A bucket that keeps no old versions loses for good whatever is replaced or deleted."""
        fix = (f"turn versioning on (aws s3api put-bucket-versioning --bucket {self.bucket} "
               "--versioning-configuration Status=Enabled), with a lifecycle rule that expires old versions")
        try:
            status = self._call("get_bucket_versioning").get("Status") or "off"
        except Exception as exc:  # noqa: BLE001 - reported, never fatal: the store works without it
            return [f"cannot tell whether bucket {self.bucket} keeps old versions (GetBucketVersioning: "
                    f"{_code(exc) or type(exc).__name__}); without them a replaced or deleted object is gone "
                    f"(to fix: allow s3:GetBucketVersioning, and {fix})"]
        if status == "Enabled":
            return []
        return [f"bucket {self.bucket} keeps no old versions (versioning is {status.lower()}): whatever is "
                "replaced or deleted there is gone for good. A worker's credentials only create blobs and "
                "manifests and swap their own workspace's HEAD, but a worker can still rewrite that HEAD, a "
                "service that ignores the s3:if-none-match condition lets it replace blobs every workspace "
                f"shares, and anyone with delete rights can remove them (to fix: {fix})"]

    def list(self, prefix: str) -> list[str]:
        base = self._key(prefix).rstrip("/") + "/"
        out: list[str] = []
        try:
            paginator_token: str | None = None
            while True:
                kwargs: dict[str, Any] = {"Prefix": base}
                if paginator_token:
                    kwargs["ContinuationToken"] = paginator_token
                page = self._call("list_objects_v2", **kwargs)
                for item in page.get("Contents", []):
                    key = item["Key"]
                    out.append(key[len(self.prefix) + 1:] if self.prefix else key)
                if not page.get("IsTruncated"):
                    break
                paginator_token = page["NextContinuationToken"]
        except Exception as exc:  # noqa: BLE001
            raise self._fail("list", prefix, exc) from exc
        out.sort()
        return out

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        # The token is read before the bytes: if the object changes in between, the
        # token is the older one and the later swap fails safe with a conflict.
        head = self._head(key)
        if head is None:
            return None
        return self.read(key), str(head["ETag"])

    def swap(self, key: str, data: bytes, token: str | None) -> None:
        if token is None:  # a new workspace (init) or document: before its first head
            self.check_conditional_writes()
            self._conditional_put(key, data, IfNoneMatch="*")
        else:
            self._conditional_put(key, data, IfMatch=token)

    def delete(self, key: str) -> None:
        try:
            self._call("delete_object", Key=self._key(key))
        except Exception as exc:  # noqa: BLE001
            raise self._fail("delete", key, exc) from exc
