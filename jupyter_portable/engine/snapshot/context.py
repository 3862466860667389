"""What every stage of one snapshot reads, made once by the walk."""

from __future__ import annotations

from dataclasses import dataclass

from jupyter_portable.engine.snapshot.options import Options
from jupyter_portable.engine.snapshot.uploader import Uploader
from jupyter_portable.engine.trees import BaseTree
from jupyter_portable.workdir.statcache import StatCache


@dataclass(frozen=True)
class Context:
    """One snapshot's copy, stat cache, base version, uploader and tuning, shared by its stages."""

    root: str  # the copy's folder
    cache: StatCache  # inside the snapshot's transaction
    usable: bool  # the stat cache describes the base version (else it was cleared)
    base: BaseTree  # the base version's tree, read folder by folder
    up: Uploader
    opts: Options
    fresh_ns: int  # files modified at or after this get no stat cache row (statcache.settled)
