"""Azure Blob Storage through adlfs, with ETag conditions.

Credentials are adlfs's: ``AZURE_STORAGE_CONNECTION_STRING``, or ``AZURE_STORAGE_ACCOUNT_NAME``
with ``AZURE_STORAGE_ACCOUNT_KEY`` / ``AZURE_STORAGE_SAS_TOKEN``, else Azure's default
credential chain (``az login``, a managed identity). Create-only is ``If-None-Match: *``,
compare-and-swap ``If-Match: <ETag>``; Azure answers 409 or 412 otherwise.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from jupyter_portable.core.errors import ObjectMissing, StoreError
from jupyter_portable.store.remote import NEW, Refused, RemoteBackend

T = TypeVar("T")


def _container_missing(exc: BaseException) -> bool:
    """Whether a not-found answer is about the container rather than the blob: read from the
    service's error code (the x-ms-error-code header), never from the message, which also
    holds the blob's name."""
    return getattr(exc, "error_code", None) == "ContainerNotFound"


class AzureBackend(RemoteBackend):
    """Blobs under ``az://container/prefix`` (or ``abfs://container@account.dfs.core.windows.net/prefix``)."""

    create_only_condition = "ETag conditions (If-None-Match: *)"
    swap_condition = "ETag conditions (If-Match: <ETag>)"

    def __init__(self, netloc: str, prefix: str) -> None:
        import adlfs  # heavy: only when an az:// store is used

        container, _, host = netloc.partition("@")
        if not container:
            raise StoreError("an az:// store URL needs a container: az://CONTAINER/PREFIX")
        self.container = container
        self.prefix = prefix.strip("/")
        self.url = f"az://{container}/{self.prefix}" if self.prefix else f"az://{container}"
        kwargs: dict[str, Any] = {"skip_instance_cache": True}
        if host:
            kwargs["account_name"] = host.split(".", 1)[0]
        try:
            self.fs = adlfs.AzureBlobFileSystem(**kwargs)
        except Exception as exc:  # noqa: BLE001 - translated at the boundary
            raise StoreError(f"cannot connect to {self.url}: {type(exc).__name__}",
                             hint="set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME "
                                  "and sign in with `az login`") from exc

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        from fsspec.asyn import sync

        return sync(self.fs.loop, lambda: coro)

    def _blob(self, key: str) -> Any:
        name = f"{self.prefix}/{key}" if self.prefix else key
        return self.fs.service_client.get_blob_client(self.container, name)

    def _fail(self, what: str, key: str, exc: BaseException) -> StoreError:
        from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceNotFoundError

        if isinstance(exc, ResourceNotFoundError) and not _container_missing(exc):
            return ObjectMissing(f"object {key} is missing from {self.url}", key=key)
        if isinstance(exc, ClientAuthenticationError) or getattr(exc, "status_code", None) == 403:
            return StoreError(f"access denied to {key} in {self.url}",
                              hint="check AZURE_STORAGE_CONNECTION_STRING or `az login`, and the "
                                   "Storage Blob Data Contributor role on the container")
        code = getattr(exc, "error_code", None) or (exc.status_code if isinstance(exc, HttpResponseError) else "")
        return StoreError(f"cannot {what} {key} in {self.url}: {type(exc).__name__}: {code}")

    async def _download(self, key: str, offset: int | None = None, length: int | None = None) -> tuple[bytes, str]:
        stream = await self._blob(key).download_blob(offset=offset, length=length)
        return await stream.readall(), str(stream.properties.etag)

    def read(self, key: str) -> bytes:
        try:
            return self._run(self._download(key))[0]
        except Exception as exc:  # noqa: BLE001
            raise self._fail("read", key, exc) from exc

    def read_range(self, key: str, start: int, end: int) -> bytes:
        size = self.size(key)
        end = min(end, size)
        if end <= start:
            return b""
        try:
            return self._run(self._download(key, start, end - start))[0]
        except Exception as exc:  # noqa: BLE001
            raise self._fail("read", key, exc) from exc

    def _props(self, key: str) -> Any:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return self._run(self._blob(key).get_blob_properties())
        except ResourceNotFoundError as exc:
            if _container_missing(exc):
                raise self._fail("stat", key, exc) from exc
            return None
        except Exception as exc:  # noqa: BLE001
            raise self._fail("stat", key, exc) from exc

    def exists(self, key: str) -> bool:
        return self._props(key) is not None

    def size(self, key: str) -> int:
        props = self._props(key)
        if props is None:
            raise ObjectMissing(f"object {key} is missing from {self.url}", key=key)
        return int(props.size)

    def _put(self, key: str, data: bytes, cond: str | None) -> None:
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError

        kwargs: dict[str, Any] = {"overwrite": cond != NEW}  # overwrite=False sends If-None-Match: *
        if cond not in (None, NEW):
            kwargs.update(etag=cond, match_condition=MatchConditions.IfNotModified)
        try:
            # Above 64 MiB the SDK stages blocks and commits the list: still one atomic blob.
            self._run(self._blob(key).upload_blob(data, **kwargs))
        except (ResourceExistsError, ResourceModifiedError) as exc:
            raise Refused(str(getattr(exc, "error_code", "") or exc.status_code)) from exc
        except Exception as exc:  # noqa: BLE001
            raise self._fail("write", key, exc) from exc

    def list(self, prefix: str) -> list[str]:
        base = (f"{self.prefix}/{prefix}" if self.prefix else prefix).rstrip("/") + "/"
        cut = len(self.prefix) + 1 if self.prefix else 0

        async def names() -> list[str]:
            client = self.fs.service_client.get_container_client(self.container)
            return [blob.name[cut:] async for blob in client.list_blobs(name_starts_with=base)]

        try:
            return sorted(self._run(names()))
        except Exception as exc:  # noqa: BLE001
            raise self._fail("list", prefix, exc) from exc

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        # One GET answers the bytes and the ETag of exactly those bytes.
        try:
            return self._run(self._download(key))
        except Exception as exc:  # noqa: BLE001
            err = self._fail("read", key, exc)
            if isinstance(err, ObjectMissing):
                return None
            raise err from exc

    def delete(self, key: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self._run(self._blob(key).delete_blob())
        except ResourceNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001
            raise self._fail("delete", key, exc) from exc
