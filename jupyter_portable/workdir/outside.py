"""Files that are not a copy's, written with the copy's own atomic writer: the worker's records
on its machine (its heartbeat, ``agent.json``) and this computer's trusted digests
(``worker/trust``). Nothing here is under a copy's ``.portable/``, which only ``WorkspaceCopy``
writes; the layers above reach ``workdir.files`` through this module alone (pyproject.toml's
import contract names no exemption)."""

from __future__ import annotations

from pathlib import Path

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.paths import RESERVED_TOP
from jupyter_portable.workdir.files import atomic_write


def write_outside_copy(path: Path, data: bytes, mode: int = 0o666) -> None:
    """Write ``path`` whole or not at all (a temporary file, fsynced, renamed over it); a path
    inside a copy's ``.portable/`` is refused (that folder is ``WorkspaceCopy``'s)."""
    if RESERVED_TOP in Path(path).parts:
        raise UsageError(f"{path} is inside a copy's {RESERVED_TOP}/, which only the copy writes")
    atomic_write(path, data, mode=mode)


__all__ = ["write_outside_copy"]
