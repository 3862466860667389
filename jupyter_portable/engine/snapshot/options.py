"""The snapshot's tuning, in one place: sizes, batch lengths and thresholds that decide how
its work is split between threads and processes.

Each field names the measurement behind its value (``bench/README.md`` has the runs, on the
shared 2-core machine). The first three decide how a version is laid out in the store (the
writer's choice, which ``docs/store-format.md`` states and a test holds it to); the rest change
only speed and memory.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    """How one snapshot splits and bounds its work (the defaults are what every snapshot uses)."""

    # -- the layout in the store (docs/store-format.md) ------------------------------------------
    # Not tuning: another value changes how versions are stored, so they are not measured here.
    small_max: int = 512 * 1024  # files below this are packed; the rest are stored in parts
    part_size: int = 16 * 1024 * 1024  # a large file's parts (all but the last exactly this long)
    pack_target: int = 8 * 1024 * 1024  # a pack is formed once it holds this much

    # -- memory ------------------------------------------------------------------------------
    # Bytes read but not yet durable before a reader waits: 256 MiB, the bound that keeps the
    # million-file cold snapshot's peak RSS at 165 MB (issue 15's target: 250 MB per command).
    inflight_max: int = 256 * 1024 * 1024
    # This run's pack refs kept for deduplication within the run: a hundred thousand (as
    # tuples; as dicts they held 17 MB more), long after every folder has taken its refs.
    packed_keep: int = 100_000
    # Entries of finished folders waiting for their pack refs before a pack is formed early, so
    # that they are not held for a whole 8 MiB pack of tiny files (no run of its own).
    waiting_max: int = 20_000

    # -- correctness: a write within the clock's tick ------------------------------------------
    # Files modified within this long before the snapshot started get no stat cache row (they are
    # read again next time): 2 s, the coarsest common mtime step (FAT's).
    racy_ns: int = 2_000_000_000

    # -- the file saver: threads and other processes ---------------------------------------------
    # Small files per hashing task, a thread's or another process's (no run of its own).
    batch: int = 64
    # Small files a run reads before other processes read them: 20,000. Below it a spawned
    # process's start (0.19 s) is not repaid; above it, 1,000,000 files: 90 s -> 77-86 s.
    process_min: int = 20_000
    # Files queued for other processes while the walk lists the next folders, before it waits
    # for the oldest folder's files (8,192: listing and reading overlap; the same run).
    lookahead: int = 8_192

    # -- the scanner: other processes ahead of the walk ---------------------------------------------
    # Files in the last snapshot before another process stats folders from the far end of the
    # walk: 100,000. No change at 1,000,000 files, interleaved runs: 6.0-6.4 s -> 3.5-4.4 s.
    ahead_min: int = 100_000
    # Files per batch of folders it stats (about 2,000) and batches sent at a time (4): few
    # enough that files sent to the same processes to read never wait long behind them.
    ahead_chunk: int = 2_000
    ahead_in_flight: int = 4
    # A first snapshot has other processes list (and read) the next 8 folders of the walk, and
    # up to 4 MiB of a folder's small files each, writing their tree entries and rows: the
    # million-file cold snapshot 33.96 s -> 19.42 s (0.60x restic), medians of 3 interleaved.
    list_ahead: int = 8
    list_read: int = 4 * 1024 * 1024
    # Files in a folder the walk lists itself rather than receive all at once from a helper
    # (the same run; no run of its own).
    list_most: int = 20_000

    # -- the tree saver ------------------------------------------------------------------------
    # Tree objects written (and fsynced) together: 256, or a pack's worth of bytes (no run of
    # its own).
    tree_batch: int = 256

    # -- the uploader: objects sent to the store at once -----------------------------------------
    # An s3:// store answers each request in tens of milliseconds, so 8 are sent at once; a
    # file:// store is this disk's fsyncs, and the other stores keep to 2 as well (no run of its own).
    uploads: int = 2
    uploads_s3: int = 8

    # -- the restore: a large file's parts fetched from the store at once ----------------------
    # The same transfer the other way: 8 at once from an s3:// store, 4 from the others (no run
    # of its own).
    downloads: int = 4
    downloads_s3: int = 8

    def upload_pool(self, store_url: str) -> int:
        """How many objects the uploader sends to the store at ``store_url`` at once."""
        return self.uploads_s3 if store_url.startswith("s3") else self.uploads

    def download_pool(self, store_url: str) -> int:
        """How many parts of a large file a restore fetches from the store at ``store_url`` at once."""
        return self.downloads_s3 if store_url.startswith("s3") else self.downloads


DEFAULT = Options()

# The layout's sizes, by the names docs/store-format.md gives them.
SMALL_MAX = DEFAULT.small_max
PART_SIZE = DEFAULT.part_size
PACK_TARGET = DEFAULT.pack_target
