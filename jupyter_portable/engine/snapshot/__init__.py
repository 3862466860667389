"""Snapshot: publish a workspace copy's files as the workspace's next version.

The work is done in stages (see ``docs/architecture.md``), after restic's archiver:

- :mod:`.scanner` decides which folders to look at and what changed in each;
- :mod:`.file_saver` reads and hashes the changed files;
- :mod:`.tree_saver` writes each folder's tree once its files are stored;
- :mod:`.uploader` packs and writes the bytes both savers hand it;
- :mod:`.walk` runs the three over the folders, depth first;
- :mod:`.publish` writes the manifest and moves the head.

:mod:`.options` holds the tuning.
"""

from jupyter_portable.engine.snapshot.options import PACK_TARGET, PART_SIZE, SMALL_MAX
from jupyter_portable.engine.snapshot.publish import (
    Extras,
    SnapshotResult,
    adopt_published,
    publish_records,
    snapshot,
)

__all__ = ["PACK_TARGET", "PART_SIZE", "SMALL_MAX", "Extras", "SnapshotResult", "adopt_published",
           "publish_records", "snapshot"]
