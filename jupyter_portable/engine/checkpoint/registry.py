"""Registering a checkpoint: write check, upload, read-back, then "verified" (invariant 3).

The checkpoint's bytes travel in an ordinary snapshot of the workspace; before that
version is published they are read back from the store and hashed. Only a checkpoint
that passed every step is published as verified; a rejected one is published with its
reason, its files left at their previous version, and "latest" never moves to it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3

from jupyter_portable.core import hooks
from jupyter_portable.core.errors import IntegrityError, StoreError, UsageError
from jupyter_portable.core.manifest import FileEntry, Manifest
from jupyter_portable.core.paths import in_reserved
from jupyter_portable.core.records import CheckpointRecord, latest_verified
from jupyter_portable.core.times import now_iso
from jupyter_portable.engine.checkpoint.writecheck import WriteCheck, check_checkpoint, not_a_file
from jupyter_portable.engine.listing import Lister, ignore_spec
from jupyter_portable.engine.progress import Progress
from jupyter_portable.store.repo import Store, object_key


def relative_to_workspace(root: Path, path: str | os.PathLike[str]) -> str:
    """``path`` (absolute, or relative to the current folder) as a workspace-relative path."""
    full = Path(path)
    if not full.is_absolute():
        full = Path.cwd() / full
    full = Path(os.path.abspath(full))
    try:
        rel = full.relative_to(root)
    except ValueError as exc:
        raise UsageError(f"{path} is outside the workspace {root}",
                         hint="save checkpoints inside the workspace folder") from exc
    text = rel.as_posix()
    if text in ("", "."):
        raise UsageError("the workspace folder itself cannot be a checkpoint")
    if in_reserved(text):
        raise UsageError(f"{path} is inside .portable")
    spec = ignore_spec(root)
    if spec.match_file(text) or spec.match_file(text + "/"):
        raise UsageError(f"{text} is excluded by .portableignore, so it would never reach the store",
                         hint="remove the pattern that matches it from .portableignore")
    return text


def leads_outside(root: Path, rel: str) -> str | None:
    """Why ``rel`` (or, for a directory, something under it) is reached through a symlink that
    leads outside the workspace, or None. A snapshot leaves such a link out."""
    real_root = os.path.realpath(root)

    def outside(full: str) -> bool:
        real = os.path.realpath(full)
        return real != real_root and not real.startswith(real_root + os.sep)

    full = os.path.join(root, rel)
    if outside(full):
        return f"it is reached through a symlink that points outside the workspace (to {os.path.realpath(full)})"
    if os.path.isdir(full):
        for dirpath, dirnames, filenames in os.walk(full):
            for name in sorted(dirnames + filenames):
                entry = os.path.join(dirpath, name)
                if os.path.islink(entry) and outside(entry):
                    inner, real = os.path.relpath(entry, root), os.path.realpath(entry)
                    return f"{inner} in it is a symlink that points outside the workspace (to {real})"
    return None


def left_out(root: Path, rel: str) -> str | None:
    """Why the checkpoint ``rel``, or something under it, would be left out of every snapshot (the
    ignore rules match it, or its path holds a backslash), or None. Its files would never reach
    the store, so the checkpoint could never be verified whole."""
    if "\\" in rel:
        return f"{rel!r} has a backslash in its path, which no snapshot stores"
    full = root / rel
    if not full.is_dir():
        return None
    match = Lister(root, warn=False).match
    for dirpath, dirnames, filenames in os.walk(full):
        base = Path(dirpath).relative_to(root).as_posix()
        for name in sorted(dirnames):
            if match(f"{base}/{name}/"):  # as a snapshot's walk asks of a folder
                return f"'{base}/{name}/' in it is excluded by the ignore rules (.portableignore or the defaults)"
        for name in sorted(filenames):
            path = f"{base}/{name}"
            if match(path):
                return f"'{path}' in it is excluded by the ignore rules (.portableignore or the defaults)"
            if "\\" in path:
                return f"{path!r} in it has a backslash in its path, which no snapshot stores"
    return None


def listing_hash(entries: list[FileEntry], prefix: str) -> str:
    """A directory checkpoint's hash: BLAKE3 over its sorted "relative path NUL hash LF" lines."""
    h = blake3.blake3()
    for e in sorted(entries, key=lambda e: e.path):
        # a name that is not UTF-8 on disk is its bytes (surrogateescape, as the store writes names)
        h.update(f"{e.path[len(prefix) + 1:]}\0{e.hash or e.target}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


class CheckpointStep:
    """The ``before_publish`` step of a checkpoint's snapshot: read-back, then the record."""

    def __init__(self, store: Store, rel: str, check: WriteCheck, step: int | None, note: str,
                 signed: dict[str, tuple[int, int, int, int]] | None = None,
                 progress: Progress | None = None) -> None:
        self.store = store
        self.rel = rel
        self.check = check
        self.step = step
        self.note = note
        self.is_dir = False
        self.record: CheckpointRecord | None = None
        # each file's size, mtime, ctime and inode when it passed the write check (the call
        # returned then): what is uploaded must be those bytes, not a later rewrite
        self.signed = signed
        self.progress = progress
        self.root: Path | None = None
        # parts the snapshot read back as soon as it wrote them, each hashed equal to its name
        self.read_back: set[str] = set()
        # called by the upload before each part's write and read-back (the queue's ``hold``: it
        # waits there while the trainer saves)
        self.gate: Callable[..., None] | None = None

    def _record(self, base: Manifest | None, **fields: Any) -> CheckpointRecord:
        ids = [c.get("id", 0) for c in (base.checkpoints if base else ())]
        version = (base.version if base else 0) + 1
        return CheckpointRecord(id=max(ids, default=0) + 1, path=self.rel, created=now_iso(), step=self.step,
                                note=self.note, format=self.check.format,
                                kind="directory" if self.is_dir else "file", version=version, **fields)

    def __call__(self, entries: dict[str, dict[str, Any]], base: Manifest | None) -> tuple[list[dict], set[str]]:
        if not self.check.ok:
            self.record = self._record(base, status="rejected", reason=self.check.reason)
            return [self.record.to_json()], {self.rel}
        mine = [e if isinstance(e, FileEntry) else FileEntry.from_json(e) for p, e in entries.items()
                if p == self.rel or p.startswith(self.rel + "/")]
        if not mine:
            gone = self.root is not None and not os.path.lexists(self.root / self.rel)
            self.record = self._record(base, status="rejected", reason=(
                f"'{self.rel}' was removed before its upload was verified; keep checkpoints until they are verified"
                if gone else "it changed while it was being uploaded (a torn upload is never verified); "
                             "register it again when the writer has finished"))
            return [self.record.to_json()], {self.rel}
        torn = self._rewritten(mine)
        if torn is not None:
            self.record = self._record(base, status="rejected", reason=torn)
            return [self.record.to_json()], {self.rel}
        # a file whose every part was read back as it went up, and hashed equal to its name, is
        # back already: its hash is over those same parts, in order
        back = [e for e in mine if e.pack is None and e.target is None and e.parts
                and all(h in self.read_back for h, _n in e.parts)]
        later = [e for e in mine if e not in back]
        if later:
            hooks.before_readback(self.store, [object_key(h) for e in later for h in e.object_keys()])
        p = self.progress
        if p is not None:
            p.bytes_done, p.bytes_total = sum(e.size for e in back), sum(e.size for e in mine)
            p.set_stage("verifying")
        try:
            for e in later:
                self.store.verify_file(e, on_bytes=None if p is None else (lambda n: p.add(nbytes=n)))
        except (IntegrityError, StoreError) as exc:
            self.record = self._record(base, status="rejected", reason=f"read-back from the store failed: {exc}")
            return [self.record.to_json()], {self.rel}
        if self.root is not None and self.signed is not None:
            torn = self._rewritten(mine)  # rewritten while it was read back: the upload may be torn
            if torn is not None:
                self.record = self._record(base, status="rejected", reason=torn)
                return [self.record.to_json()], {self.rel}
        single = len(mine) == 1 and mine[0].path == self.rel
        if single and not mine[0].hash:  # a symlink (prepare resolves them): no bytes were read back
            self.record = self._record(base, status="rejected",
                                       reason="it is stored as a symlink, with no bytes to read back; register "
                                              "the file it points to")
            return [self.record.to_json()], {self.rel}
        digest = mine[0].hash if single else listing_hash(mine, self.rel)
        self.record = self._record(base, status="verified", hash=digest, size=sum(e.size for e in mine),
                                   files=len(mine))
        return [self.record.to_json()], set()


    def _rewritten(self, mine: list[FileEntry]) -> str | None:
        """Why the bytes uploaded are not those that passed the write check, or None. The
        snapshot hashed what it read and compared the file's stat before and after reading;
        here the files are held to their signatures at registration, and to their state now."""
        if self.signed is None or self.root is None:
            return None
        stored = {e.path: e for e in mine if e.target is None}
        if set(stored) != set(self.signed):
            # a writer removing it (a trainer's own save limit) while the listing was taken: say removed
            gone = [p for p in self.signed if not os.path.lexists(self.root / p)]
            if gone and set(stored) <= set(self.signed):
                return (f"'{gone[0]}' was removed before its upload was verified; keep checkpoints until they "
                        "are verified")
            return ("its files changed after it was registered (files appeared or disappeared); register it "
                    "again when the writer has finished")
        for path, (size, mtime_ns, ctime_ns, ino) in self.signed.items():
            e = stored[path]
            try:
                st = os.lstat(self.root / path)
            except OSError:
                return f"'{path}' was removed before its upload was verified; keep checkpoints until they are verified"
            if (e.size, e.mtime_ns) != (size, mtime_ns) or (st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                                                            st.st_ino) != (size, mtime_ns, ctime_ns, ino):
                return (f"'{path}' was rewritten after it was registered, while it was uploading: the bytes "
                        "uploaded are not the ones that passed the write check (a torn upload is never verified)")
        return None


def prepare(root: Path, path: str | os.PathLike[str], *, quiet_s: float = 2.0,
            timeout_s: float = 30.0) -> tuple[str, WriteCheck]:
    """Resolve the path and run the write check (waits for the file to hold still)."""
    rel = relative_to_workspace(root, path)
    if not os.path.lexists(root / rel):
        raise UsageError(f"{rel} does not exist: nothing to register",
                         hint="save the checkpoint first, or give its path relative to this folder")
    outside = leads_outside(root, rel)
    if outside is not None:
        raise UsageError(f"cannot register {rel}: {outside}, so its bytes would never reach the store",
                         hint="copy the checkpoint into the workspace folder and register the copy")
    rel = _resolved(root, rel)
    dropped = left_out(root, rel)
    if dropped is not None:
        raise UsageError(f"cannot register {rel}: {dropped}, so the checkpoint would never reach the store whole",
                         hint="move it out of the checkpoint folder, or remove the pattern that matches it")
    special = not_a_file(root / rel)
    if special is not None:
        raise UsageError(f"cannot register {rel}: {special}",
                         hint="register the regular file or directory the checkpoint was saved as")
    try:
        return rel, check_checkpoint(root / rel, quiet_s=quiet_s, timeout_s=timeout_s)
    except OSError as exc:
        return rel, WriteCheck(False, "file", f"could not be read: {exc.strerror or exc}", ())


def _resolved(root: Path, rel: str) -> str:
    """``rel`` with the symlinks on its way resolved (they lead inside the workspace: ``leads_outside``
    is asked first): a snapshot stores a symlink as its target's name, which has no bytes to verify,
    so the checkpoint is the file or folder it points to, under the same rules."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(root / rel)
    if real == os.path.join(real_root, rel):
        return rel
    target = relative_to_workspace(root, root / os.path.relpath(real, real_root))
    if not os.path.exists(root / target):
        raise UsageError(f"{rel} is a symlink to {target}, which does not exist: nothing to register",
                         hint="register the file the checkpoint was saved as")
    return target


def records(manifest: Manifest | None) -> list[CheckpointRecord]:
    return [CheckpointRecord.from_json(c) for c in (manifest.checkpoints if manifest else ())]


def latest(manifest: Manifest | None) -> CheckpointRecord | None:
    return latest_verified(records(manifest))
