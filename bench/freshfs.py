"""A new, empty filesystem for a timed write: ext4 in a sparse image file, loop-mounted.

On this machine's root ext4 (no journal), making a file soon after many were deleted skips
each recently freed inode one at a time (perf: ``recently_deleted``, ``find_inode_bit``), so a
tree written where another was just removed is timed against that removal as much as against
the write. A new machine has a new filesystem: the benchmarks that time writing many files give
each timed write one of these. Needs root, ``mkfs.ext4`` and ``mount``."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path


def available() -> bool:
    return os.geteuid() == 0 and shutil.which("mkfs.ext4") is not None and shutil.which("mount") is not None


class Mounts:
    """The filesystems made so far (mount point -> image), each unmounted and deleted on release."""

    def __init__(self) -> None:
        self.mounted: dict[Path, Path] = {}

    def make(self, mnt: Path, size: int, inodes: int) -> Path:
        """A new ext4 of ``size`` bytes (sparse) and ``inodes`` inodes mounted at the empty folder
        ``mnt``, its image beside it; its inode tables and journal are written at mkfs (nothing
        initialises lazily beside the timed work) and everything is synced. Returns the folder
        ``tree`` on it (the filesystem's root holds lost+found)."""
        image = mnt.with_name(mnt.name + ".ext4")
        image.unlink(missing_ok=True)
        with open(image, "wb") as fh:
            fh.truncate(size)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-N", str(inodes), "-E", "lazy_itable_init=0,lazy_journal_init=0",
                        str(image)], check=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
        self.mounted[mnt] = image
        dest = mnt / "tree"
        dest.mkdir()
        os.sync()
        return dest

    def release(self, mnt: Path) -> None:
        """Unmount a filesystem ``make`` made at ``mnt``, and delete its image."""
        image = self.mounted.pop(mnt, None)
        if image is None:
            return
        for _ in range(10):  # a command's helper processes can still be leaving it
            if subprocess.run(["umount", str(mnt)], stderr=subprocess.DEVNULL).returncode == 0:
                break
            time.sleep(1)
        else:
            subprocess.run(["umount", "--lazy", str(mnt)], check=True)
        image.unlink(missing_ok=True)

    def release_all(self) -> None:
        for mnt in list(self.mounted):
            self.release(mnt)
