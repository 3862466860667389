"""jupyter-portable: a durable workspace for notebooks on rented GPUs."""

from __future__ import annotations

from .errors import (
    ConflictError,
    FencedError,
    IntegrityError,
    ManifestError,
    PortableError,
    StoreError,
    UnsafePath,
    UsageError,
)
from .workspace import Workspace

__version__ = "0.1.0"

__all__ = [
    "ConflictError",
    "FencedError",
    "IntegrityError",
    "ManifestError",
    "PortableError",
    "StoreError",
    "UnsafePath",
    "UsageError",
    "Workspace",
    "__version__",
]
