"""The publish step, and the snapshot that ends in it: walk, hash what changed, upload what
the store lacks, then publish.

Order (invariant 2): pack objects and parts, then pack indexes, then the manifest,
then the head by compare-and-swap. A file whose size or mtime moves while it is read
is not published this time; its previous version (if any) stays.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_portable.core.errors import ConflictError, FencedError, PortableError, UsageError
from jupyter_portable.core.manifest import FileEntry, Manifest, ParentRef
from jupyter_portable.core.times import now_iso
from jupyter_portable.core.validate import check_message
from jupyter_portable.engine.journal import Cut
from jupyter_portable.engine.progress import Progress, human_bytes
from jupyter_portable.engine.snapshot import options as tuning
from jupyter_portable.engine.snapshot.options import Options
from jupyter_portable.engine.snapshot.scanner import journal_plan
from jupyter_portable.engine.snapshot.uploader import Uploader
from jupyter_portable.engine.snapshot.walk import Walk
from jupyter_portable.engine.trees import BaseTree, as_tree, iter_under, replace_at, write_trees
from jupyter_portable.store.repo import CONFLICT_HINT, Store, digest
from jupyter_portable.workdir.statcache import ROOT, StatCache
from jupyter_portable.workdir.workcopy import CopyConfig, WorkspaceCopy


@dataclass
class SnapshotResult:
    workspace_id: str
    version: int
    files: int
    bytes: int
    new_bytes: int
    changed: bool
    skipped: list[str] = field(default_factory=list)
    hashed: int = 0  # files read and hashed (the rest were known from the stat cache)
    # FIFOs, sockets and devices, never recorded: [{"path": ..., "kind": "FIFO"}]
    special: list[dict[str, str]] = field(default_factory=list)
    tree_bytes: int = 0  # tree objects written (format 2), besides the data in new_bytes
    # "journal": only the folders on the way to the journal's changed paths were listed; "full":
    # the whole tree was walked, for ``walk_reason`` where a journal was given
    walk: str = "full"
    walk_reason: str | None = None
    rewatched: int = 0  # folders a full walk found without a (right) watch, and watched again
    folders: int = 0  # folders looked at (a full walk: every folder the ignore rules keep)

    @property
    def walk_note(self) -> str:
        """How this snapshot walked, in words: "journal", or "full (why); re-watched 3 folders"."""
        text = self.walk if self.walk_reason is None else f"{self.walk} ({self.walk_reason})"
        if self.rewatched:
            text += f"; re-watched {self.rewatched} folder{'s' if self.rewatched != 1 else ''}"
        return text

    def to_json(self) -> dict[str, Any]:
        """``skipped`` lists every path not recorded as it is now: changed while read, or not
        recorded at all (``special``, with the kind or reason: a FIFO, a socket, a device, a name with
        a backslash, a symlink leading outside). ``new_bytes`` is what was written to the store."""
        return {"workspace_id": self.workspace_id, "version": self.version, "files": self.files,
                "bytes": self.bytes, "new_bytes": self.new_bytes, "changed": self.changed,
                "skipped": sorted(self.skipped + [s["path"] for s in self.special]), "special": self.special,
                "hashed": self.hashed}


@dataclass
class Extras:
    """What a caller adds to the version a snapshot publishes.

    ``fingerprint`` names the environment cheaply: when it differs from the one the
    stat cache remembers, the no-change shortcut is not taken. ``runtime`` is called
    only when a version is published, with the base manifest, and returns the runtime
    record (it may store objects first). ``before_publish`` sees the entries about to
    be published and returns checkpoint records to add and paths to keep at their base
    version (a checkpoint whose read-back failed is not published).
    """

    fingerprint: str | None = None
    runtime: Callable[[Manifest | None], dict[str, Any] | None] | None = None
    next_action: dict[str, Any] | None = None
    before_publish: Callable[[dict[str, Any], Manifest | None],
                             tuple[list[dict[str, Any]], set[str]]] | None = None
    # Allocation records to add; one with the allocation_id of an earlier record replaces it.
    allocations: list[dict[str, Any]] = field(default_factory=list)


def _pending_by_folder(copy: WorkspaceCopy, version: int) -> dict[str, dict[str, FileEntry]]:
    from jupyter_portable.workdir.pending import read_pending

    pending_version, pending = read_pending(copy)
    out: dict[str, dict[str, FileEntry]] = {}
    if pending_version == version:
        for e in pending:
            folder, _, name = e.path.rpartition("/")
            out.setdefault(folder, {})[name] = e
    return out


def _count(store: Store, root: str | None, path: str) -> tuple[int, int]:
    if root is None:
        return 0, 0
    n = b = 0
    for e in iter_under(store, root, path):
        n += 1
        b += e.size
    return n, b


WAIT_TRIES = 360  # tries of sqlite's 5 s: a snapshot waits 30 minutes at most for another of the same copy


def snapshot(copy: WorkspaceCopy, store: Store, *, message: str = "", force: bool = False,
             progress: Progress | None = None, extras: Extras | None = None,
             journal: Cut | None = None, options: Options | None = None) -> SnapshotResult:
    """Publish the copy's files as the workspace's next version (or report no change).

    With ``journal`` (a cut of an ``engine.journal.ChangeJournal`` taken just before) and a
    stat cache written by the snapshot that took the cut before it, only the folders on the
    way to the changed paths are looked at; otherwise the whole tree is walked, and
    ``walk_reason`` says why. ``options``: the tuning (``options.DEFAULT`` where not given)."""
    check_message(message, error=UsageError)  # it is printed on terminals: `jupyter portable log`
    progress = progress or Progress("snapshot")
    # One snapshot of this copy at a time, in any process (the stat cache's write transaction, taken
    # first): one that waited for another (the worker agent's, beside a kernel's checkpoint upload)
    # builds on the version that one recorded, not on the one the copy had before it waited.
    cache = copy.open_statcache(PortableError)
    try:
        try:
            try:
                cache.begin()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc):
                    raise
                # said, not left silent: a checkpoint's upload ahead of it can take minutes
                progress.set_stage("waiting for another snapshot of this copy to finish (a checkpoint uploading?)")
                cache.begin(tries=WAIT_TRIES - 1)
        except sqlite3.OperationalError as exc:
            raise ConflictError(f"another snapshot of this copy held it for {WAIT_TRIES * 5 // 60} minutes ({exc})",
                                hint="wait for it (a checkpoint uploading: `jupyter portable status`), "
                                     "then snapshot again") from exc
        cfg: CopyConfig = copy.read_config()
        ws = cfg.workspace_id
        head, _ = store.read_head(ws)
        cfg = adopt_published(copy, cfg, head.version, head.manifest)
        if head.epoch > cfg.epoch:
            raise FencedError(
                f"workspace {ws} was claimed by a newer allocation (epoch {head.epoch}, this copy holds "
                f"{cfg.epoch}); this copy can no longer publish",
                hint="restore the workspace afresh to continue from its latest version")
        if head.version != cfg.version and not force:
            raise ConflictError(
                f"workspace {ws} is at version {head.version} but this copy is based on version {cfg.version}",
                hint=CONFLICT_HINT)
        base_version = head.version if force else cfg.version
        base_manifest = store.read_manifest(ws, base_version) if base_version else None
        # A schema-1 base gets trees now (the upgrade); a schema-2 base is read folder by folder.
        base_root = as_tree(store, base_manifest)[0] if base_manifest is not None else None
        base = BaseTree(store, base_root)
    except BaseException:
        cache.abandon()
        cache.close()
        raise
    extras = extras or Extras()
    started_ns = time.time_ns()
    progress.set_stage("scanning")
    opts = options if options is not None else tuning.DEFAULT
    up = Uploader(store, opts.upload_pool(store.url), progress, opts)
    if extras is not None and isinstance(getattr(extras.before_publish, "read_back", None), set):
        # a checkpoint's snapshot: its parts are read back as they go up (engine/checkpoint/registry)
        up.read_back_under = getattr(extras.before_publish, "rel", None)
        up.read_back = extras.before_publish.read_back  # type: ignore[union-attr]
        up.gate = getattr(extras.before_publish, "gate", None)
    try:
        usable = (not force and base_manifest is not None and base_manifest.tree is not None
                  and cache.valid_for(cfg.version))
        fingerprint_same = usable and cache.fingerprint() == extras.fingerprint
        if not usable:
            cache.clear()
        up.blobs = cache.blob_reader()
        pending = _pending_by_folder(copy, cfg.version)
        plan, walk_reason = journal_plan(str(copy.root), journal, cache, usable, force, pending)
        old_links = cache.link_folders() if plan is not None else None
        walk = Walk(copy, cache, usable, base, up, progress, started_ns, pending, plan, opts)
        try:
            top = walk.run()
        except BaseException:
            up.pool.shutdown(wait=False, cancel_futures=True)
            raise
        skipped, special = walk.trees.skipped, walk.scanner.special
        walk_kind = "journal" if plan is not None else "full"
        # Every full walk heals the journal that took the cut: folders without a watch get one.
        rewatched = (journal.rearm(walk.scanner.looked)
                     if walk_kind == "full" and journal is not None and journal.rearm is not None else 0)
        looked = len(walk.scanner.looked)
        # the hard-link count, checked again when the files were listed: a journal snapshot that
        # found a changed file with other names makes the next snapshot walk the whole tree
        linked = walk.scanner.linked
        cache.set_meta("walk_next", f"{linked} had other hard links when it was read" if linked else None)
        # Folders holding symlinks: those of the folders looked at, and the rest as they were.
        cache.set_link_folders(walk.scanner.link_dirs | ((old_links or set()) - walk.scanner.looked))
        token = journal.token if journal is not None else None
        if (top.unchanged and fingerprint_same and extras.before_publish is None and not extras.allocations
                and base_manifest is not None):
            # Every file's size, mtime, ctime and inode (every link's target) are as
            # recorded for the base version: nothing changed, nothing to read. The signatures
            # of folders listed with care this time are kept, so the next run trusts them.
            up.pool.shutdown()
            cache.set_journal(token)
            cache.commit()
            progress.done(f"no changes since version {base_version} ({top.files} files, {human_bytes(top.bytes)})")
            return SnapshotResult(ws, base_version, top.files, top.bytes, 0, False, [], 0, special,
                                  walk=walk_kind, walk_reason=walk_reason, rewatched=rewatched, folders=looked)
        progress.set_stage("uploading")
        up.finish()
        cache.add_blobs(up.take_formed())
        assert top.tree is not None
        root, files, total = top.tree, top.files, top.bytes

        new_checkpoints: list[dict[str, Any]] = []
        if extras.before_publish is not None:
            rel = getattr(extras.before_publish, "rel", None)
            mine = iter_under(store, root, rel) if isinstance(rel, str) else store.iter_files(root)
            entries: dict[str, Any] = {e.path: e for e in mine}
            new_checkpoints, revert = extras.before_publish(entries, base_manifest)
            for path in revert:  # back to what the base version had there, or absent
                was_n, was_b = _count(store, root, path)
                now_n, now_b = _count(store, base_root, path)
                root = replace_at(store, root, path, base.node(path))
                files, total = files - was_n + now_n, total - was_b + now_b
                _forget(cache, path)
        unchanged = (base_manifest is not None and base_manifest.tree is not None and root == base_root
                     and not new_checkpoints and not extras.allocations)
        runtime = base_manifest.runtime if base_manifest else None
        if extras.runtime is not None:
            runtime = extras.runtime(base_manifest)
            if base_manifest is not None and runtime != base_manifest.runtime:
                unchanged = False
        if unchanged and not force:
            cache.set_version(base_version, extras.fingerprint, journal=token)
            cache.commit()
            progress.done(f"no changes since version {base_version} ({files} files, {human_bytes(total)})")
            return SnapshotResult(ws, base_version, files, total, up.new_bytes, False, sorted(skipped),
                                  walk.files.hashed, special, walk=walk_kind, walk_reason=walk_reason,
                                  rewatched=rewatched, folders=looked)

        head, _ = store.read_head(ws)
        parent = None
        if base_version:
            if head.version == base_version and head.manifest:
                parent = ParentRef(base_version, head.manifest)
            else:
                raise ConflictError(f"workspace {ws} moved to version {head.version} during the snapshot",
                                    hint=CONFLICT_HINT)
        manifest = Manifest.with_tree(
            root, files, total, store,
            workspace_id=ws, version=base_version + 1, created=now_iso(),
            parent=parent, message=message, epoch=cfg.epoch,
            checkpoints=(base_manifest.checkpoints if base_manifest else ()) + tuple(new_checkpoints),
            runtime=runtime,
            next_action=extras.next_action if extras.next_action is not None
            else (base_manifest.next_action if base_manifest else None),
            allocations=_merge_allocations(base_manifest.allocations if base_manifest else (), extras.allocations),
        )
        progress.set_stage("publishing")
        # Say what we are about to publish, so a copy killed right after the head moved
        # recognises the new version as its own (see adopt_published) instead of a conflict.
        copy.write_intent(manifest.version, digest(manifest.to_bytes()))
        store.publish(manifest, expected_version=base_version, epoch=cfg.epoch)
        cfg.version = manifest.version
        copy.write_config(cfg)
        copy.clear_intent()
        cache.set_version(manifest.version, extras.fingerprint, journal=token)
        cache.commit()
    except BaseException:
        cache.abandon()
        raise
    finally:
        if up.blobs is not None:
            up.blobs.close()
        cache.close()
    progress.done(f"published version {manifest.version}: {files} files, {human_bytes(total)}, "
                  f"{human_bytes(up.new_bytes)} new"
                  + (f"; {len(skipped)} file(s) changed while read, left for the next snapshot"
                     if skipped else "")
                  + (f"; {len(special)} not backed up (see the warnings)" if special else ""))
    result = SnapshotResult(ws, manifest.version, files, total, up.new_bytes, True, sorted(skipped),
                            walk.files.hashed, special, walk=walk_kind, walk_reason=walk_reason, rewatched=rewatched,
                            folders=looked)
    result.tree_bytes = up.tree_bytes
    return result


def _forget(cache: StatCache, path: str) -> None:
    """Make the next snapshot look at ``path`` again (its folders' trees are no longer the cached ones)."""
    dir_id = ROOT
    cache.set_folder(ROOT, None, 0, 0)
    for name in path.split("/")[:-1]:
        got = cache.child(dir_id, name)
        if got is None:
            return
        dir_id = got[0]
        cache.set_folder(dir_id, None, 0, 0)
    leaf = cache.child(dir_id, path.rpartition("/")[2])
    if leaf is not None:
        cache.drop_folder(leaf[0])
    cache.add_rows(dir_id, [(path.rpartition("/")[2], None)])


def _merge_allocations(old: tuple[dict[str, Any], ...], new: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    out = list(old)
    for record in new:
        for i, prev in enumerate(out):
            if prev.get("allocation_id") == record.get("allocation_id"):
                out[i] = record
                break
        else:
            out.append(record)
    return tuple(out)


def adopt_published(copy: WorkspaceCopy, cfg: CopyConfig, head_version: int, head_manifest: str | None) -> CopyConfig:
    """If this copy died between moving the head and recording it, record it now."""
    intent = copy.read_intent()
    if intent is None:
        return cfg
    version, mhash = intent
    if head_version == version and head_manifest == mhash and cfg.version == version - 1:
        cfg.version = version
        copy.write_config(cfg)
    copy.clear_intent()
    return cfg


def publish_records(store: Store, workspace_id: str, *, epoch: int, allocations: list[dict[str, Any]],
                    message: str, tries: int = 8) -> int:
    """Publish the head's files again with ``allocations`` merged into its history: a
    version that records what happened to machines without touching any file.

    Used by whoever holds the lease when no worker copy can publish (the orchestration
    after a loss, a failed Continue or a release). Retries when another writer moved the
    head first; FencedError when the head's epoch is newer than ``epoch``. Returns the
    published version.
    """
    for _attempt in range(tries):
        head, _ = store.read_head(workspace_id)
        base = store.read_manifest(workspace_id, head.version) if head.version else None
        if head.epoch > epoch:
            raise FencedError(f"workspace {workspace_id} was claimed by a newer allocation (epoch {head.epoch}, "
                              f"this writer holds {epoch}); it can no longer publish")
        # The same tree as the head (written now if the head is schema 1): no file is read or sent.
        root, files, total = as_tree(store, base) if base else write_trees(store, ())
        manifest = Manifest.with_tree(
            root, files, total, store,
            workspace_id=workspace_id, version=head.version + 1, created=now_iso(),
            message=message, epoch=epoch,
            parent=ParentRef(head.version, head.manifest) if base and head.manifest else None,
            checkpoints=base.checkpoints if base else (), runtime=base.runtime if base else None,
            next_action=base.next_action if base else None,
            allocations=_merge_allocations(base.allocations if base else (), allocations))
        try:
            store.publish(manifest, expected_version=head.version, epoch=epoch)
        except FencedError:
            raise
        except ConflictError:
            continue
        return manifest.version
    raise ConflictError(f"workspace {workspace_id}: other writers kept moving the head; the record was not published",
                        hint="try again")
