"""Google Cloud Storage through gcsfs, with generation preconditions.

Credentials are Google's usual Application Default Credentials (``gcloud auth
application-default login``, ``GOOGLE_APPLICATION_CREDENTIALS``, a VM's service account);
``STORAGE_EMULATOR_HOST`` points at an emulator. Create-only is ``ifGenerationMatch=0``,
compare-and-swap is ``ifGenerationMatch=<generation read>``; GCS answers 412 otherwise.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jupyter_portable.core.errors import StoreError
from jupyter_portable.store.remote import NEW, Refused, RemoteBackend

# One request up to here; above, gcsfs's resumable upload in 50 MiB chunks.
SIMPLE_UPLOAD_MAX = 32 * 1024 * 1024


class GCSBackend(RemoteBackend):
    """Objects under ``gs://bucket/prefix``."""

    create_only_condition = "generation preconditions (ifGenerationMatch=0)"
    swap_condition = "generation preconditions (ifGenerationMatch=<generation>)"

    def __init__(self, bucket: str, prefix: str) -> None:
        # The plain filesystem: gcsfs.GCSFileSystem asks gRPC whether a bucket is zonal first,
        # which an emulator (or a firewall) answers only after a minute's timeout.
        from gcsfs.core import GCSFileSystem  # heavy: only when a gs:// store is used

        if not bucket:
            raise StoreError("a gs:// store URL needs a bucket: gs://BUCKET/PREFIX")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"gs://{bucket}/{self.prefix}" if self.prefix else f"gs://{bucket}"
        # An emulator takes no credentials; anywhere else gcsfs finds ADC itself.
        token = "anon" if os.environ.get("STORAGE_EMULATOR_HOST") else None
        self.fs = GCSFileSystem(token=token, skip_instance_cache=True, use_listings_cache=False,
                                      cache_timeout=0)

    def _bucket_exists(self) -> bool | None:
        try:
            self._call("GET", "b/{}", self.bucket, json_out=True)
        except FileNotFoundError:
            return False
        except Exception:  # noqa: BLE001 - cannot tell (no rights to ask, say): the key's own error stands
            return None
        return True

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, what: str, key: str, exc: BaseException) -> StoreError:
        if isinstance(exc, FileNotFoundError):
            return self._missing(key)
        # gcsfs raises PermissionError or OSError("Forbidden: <path>") for a 403 and HttpError
        # with the status as .code otherwise. Never look for a status in the message: it holds
        # the object's path, and a bucket named bkt-4161... would read as a 416 or a 401.
        code = getattr(exc, "code", None)
        if (isinstance(exc, PermissionError) or code in (401, 403)
                or (type(exc) is OSError and str(exc).startswith("Forbidden"))):
            return StoreError(f"access denied to {key} in {self.url}",
                              hint="check `gcloud auth application-default login` (or "
                                   "GOOGLE_APPLICATION_CREDENTIALS) and the bucket's IAM roles")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return StoreError(f"cannot {what} {key} in {self.url}: {type(exc).__name__}: {first[:200]}")

    def _call(self, method: str, path: str, *args: str, **kwargs: Any) -> Any:
        return self.fs.call(method, path, *args, **kwargs)

    def _meta(self, key: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", "b/{}/o/{}", self.bucket, self._key(key), json_out=True)
        except FileNotFoundError:
            self._check_bucket()
            return None
        except Exception as exc:  # noqa: BLE001 - translated at the boundary
            raise self._fail("stat", key, exc) from exc

    def read(self, key: str) -> bytes:
        try:
            _headers, body = self._call("GET", "b/{}/o/{}", self.bucket, self._key(key), alt="media")
            return bytes(body)
        except Exception as exc:  # noqa: BLE001
            raise self._fail("read", key, exc) from exc

    def read_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            if not self.exists(key):
                raise self._missing(key)
            return b""
        try:
            _headers, body = self._call("GET", "b/{}/o/{}", self.bucket, self._key(key), alt="media",
                                        headers={"Range": f"bytes={start}-{end - 1}"})
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "code", None) == 416 and not isinstance(exc, FileNotFoundError):
                return b""  # a range past the end, as a file read gives
            raise self._fail("read", key, exc) from exc
        return bytes(body)[: end - start]

    def exists(self, key: str) -> bool:
        return self._meta(key) is not None

    def size(self, key: str) -> int:
        meta = self._meta(key)
        if meta is None:
            raise self._missing(key)
        return int(meta["size"])

    def _put(self, key: str, data: bytes, cond: str | None) -> None:
        params: dict[str, str] = {}
        if cond is not None:
            params["ifGenerationMatch"] = "0" if cond == NEW else cond
        try:
            if cond is None and len(data) > SIMPLE_UPLOAD_MAX:
                self.fs.pipe_file(f"{self.bucket}/{self._key(key)}", data)  # resumable, in chunks
                return
            # Multipart, not media: fake-gcs-server checks preconditions only on multipart
            # uploads (measured); GCS itself checks them on both.
            head = json.dumps({"name": self._key(key)}).encode()
            body = (b"--==jp==\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n" + head
                    + b"\r\n--==jp==\r\nContent-Type: application/octet-stream\r\n\r\n" + data
                    + b"\r\n--==jp==--\r\n")
            self._call("POST", f"{self.fs._location}/upload/storage/v1/b/{{}}/o", self.bucket,
                       uploadType="multipart", data=body, json_out=True,
                       headers={"Content-Type": 'multipart/related; boundary="==jp=="'}, **params)
        except FileExistsError as exc:  # gcsfs's word for 412 Precondition Failed
            raise Refused("412 Precondition Failed") from exc
        except Exception as exc:  # noqa: BLE001
            raise self._fail("write", key, exc) from exc

    def list(self, prefix: str) -> list[str]:
        base = self._key(prefix).rstrip("/") + "/"
        out: list[str] = []
        page: str | None = None
        try:
            while True:
                kwargs: dict[str, Any] = {"prefix": base, "fields": "items(name),nextPageToken"}
                if page:
                    kwargs["pageToken"] = page
                got = self._call("GET", "b/{}/o", self.bucket, json_out=True, **kwargs)
                for item in got.get("items", []):
                    name = item["name"]
                    out.append(name[len(self.prefix) + 1:] if self.prefix else name)
                page = got.get("nextPageToken")
                if not page:
                    break
        except Exception as exc:  # noqa: BLE001
            raise self._fail("list", prefix, exc) from exc
        out.sort()
        return out

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        # The bytes are read at the generation named by the token: they belong together.
        meta = self._meta(key)
        if meta is None:
            return None
        generation = str(meta["generation"])
        try:
            _headers, body = self._call("GET", "b/{}/o/{}", self.bucket, self._key(key), alt="media",
                                        generation=generation)
        except FileNotFoundError:
            return self.read_versioned(key)  # replaced just now (GCS keeps no old generation here)
        except Exception as exc:  # noqa: BLE001
            raise self._fail("read", key, exc) from exc
        return bytes(body), generation

    def delete(self, key: str) -> None:
        try:
            self._call("DELETE", "b/{}/o/{}", self.bucket, self._key(key))
        except FileNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001
            raise self._fail("delete", key, exc) from exc
