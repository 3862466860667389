"""Opening a store by URL."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlparse

from jupyter_portable.core.errors import UnsupportedStore, UsageError
from jupyter_portable.store.backend import Backend, LocalBackend


def default_store_url() -> str:
    """``file://`` + a folder under the user's Jupyter data directory."""
    from jupyter_core.paths import jupyter_data_dir

    return "file://" + os.path.join(jupyter_data_dir(), "portable", "store")


def open_backend(url: str) -> Backend:
    """The backend for a store URL: ``file:///abs/path``, a plain path, ``s3://bucket/prefix``,
    ``gs://bucket/prefix``, ``az://container/prefix`` or ``hf://datasets/owner/repo[@branch]/prefix``."""
    if not url:
        raise UsageError("store URL is empty")
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        path = unquote(parsed.path) if parsed.scheme else url
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise UsageError(f"file:// URL {url!r} names a host; use file:///absolute/path")
        return LocalBackend(os.path.expanduser(path))
    if parsed.scheme in ("s3", "s3a"):
        from jupyter_portable.store.s3 import S3Backend

        return S3Backend(parsed.netloc, parsed.path)
    if parsed.scheme in ("gs", "gcs"):
        from jupyter_portable.store.gcs import GCSBackend

        return GCSBackend(parsed.netloc, parsed.path)
    if parsed.scheme in ("az", "abfs", "abfss"):
        from jupyter_portable.store.azure import AzureBackend

        return AzureBackend(parsed.netloc, parsed.path)
    if parsed.scheme == "hf":
        from jupyter_portable.store.hf import HFBackend

        return HFBackend(url.split("://", 1)[1])
    raise UnsupportedStore(
        f"store URL scheme {parsed.scheme!r} cannot publish atomically",
        hint="use file:///path, s3://bucket/prefix (S3 and compatibles), gs://bucket/prefix, "
             "az://container/prefix or hf://datasets/OWNER/REPO/prefix",
    )
