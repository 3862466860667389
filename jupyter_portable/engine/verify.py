"""Read-back checks: ``verify`` (a directory against a version and the store) and
``fsck`` (the store against itself)."""

from __future__ import annotations

import os
import random
import stat as statmod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_portable.core.errors import ManifestError, PortableError, StoreError
from jupyter_portable.core.manifest import FileEntry, Manifest, PackIndex
from jupyter_portable.engine.scan import walk
from jupyter_portable.store.repo import Store, digest, hash_file, manifests_prefix, parse_manifest_key


@dataclass
class VerifyResult:
    ok: bool
    version: int
    files: int
    mismatches: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "version": self.version, "files": self.files, "mismatches": self.mismatches}


def _check_entry(root: Path, e: FileEntry) -> str | None:
    full = os.path.join(root, e.path)
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    if e.target is not None:
        if not statmod.S_ISLNK(st.st_mode):
            return "should be a symlink"
        got = os.readlink(full)
        return None if got == e.target else f"symlink points to {got!r}, expected {e.target!r}"
    if not statmod.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_size != e.size:
        return f"size {st.st_size} differs from {e.size}"
    try:
        if hash_file(full, e.size) != e.hash:
            return "content differs (hash mismatch)"
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    if st.st_mode & 0o777 != e.mode & 0o777:
        return f"mode {oct(st.st_mode & 0o777)} differs from {oct(e.mode & 0o777)}"
    return None


def verify_dir(store: Store, manifest: Manifest, root: Path, pending: set[str] | None = None) -> VerifyResult:
    """Compare ``root`` with ``manifest`` byte for byte, and check its objects are in the store."""
    pending = pending or set()
    mismatches: list[dict[str, str]] = []
    todo = [e for e in manifest.files if e.path not in pending]
    with ThreadPoolExecutor(4) as pool:
        for e, reason in zip(todo, pool.map(lambda e: _check_entry(root, e), todo), strict=False):
            if reason:
                mismatches.append({"path": e.path, "reason": reason})
    for path in sorted(pending):
        mismatches.append({"path": path, "reason": "not fetched yet (lazy restore still running)"})
    known = {e.path for e in manifest.files}
    for f in walk(root, warn=False):
        if f.path not in known:
            mismatches.append({"path": f.path, "reason": f"not in version {manifest.version}"})
    missing = _missing_objects(store, manifest.object_hashes())
    by_object: dict[str, str] = {}
    for e in manifest.files:
        for h in e.object_keys():
            by_object.setdefault(h, e.path)
    for h in sorted(missing):
        mismatches.append({"path": by_object[h], "reason": f"object {h[:16]}… is missing from the store"})
    mismatches.sort(key=lambda m: m["path"])
    return VerifyResult(not mismatches, manifest.version, len(manifest.files), mismatches)


def _missing_objects(store: Store, hashes: set[str]) -> set[str]:
    if len(hashes) > 64:  # one listing beats many existence checks
        try:
            listed = {k.rsplit("/", 1)[-1] for k in store.backend.list("objects")}
            return hashes - listed
        except StoreError:
            pass  # a worker's scoped credentials may not list the shared blobs: check each one
    with ThreadPoolExecutor(8) as pool:
        return {h for h, ok in zip(sorted(hashes), pool.map(store.has_object, sorted(hashes)), strict=False) if not ok}


@dataclass
class FsckResult:
    ok: bool
    manifests: int
    objects: int
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    read_objects: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "manifests": self.manifests, "objects": self.objects,
                "errors": self.errors, "warnings": self.warnings, "read_objects": self.read_objects}


def parse_subset(text: str | None) -> float | None:
    """``"10%"`` or ``"0.1"`` or ``"1/10"`` -> fraction; None for everything."""
    if text is None:
        return None
    try:
        if text.endswith("%"):
            frac = float(text[:-1]) / 100
        elif "/" in text:
            a, b = text.split("/", 1)
            frac = float(a) / float(b)
        else:
            frac = float(text)
    except ValueError as exc:
        raise PortableError(f"--read-data-subset {text!r} is not a fraction like 10% or 1/10") from exc
    if not 0 < frac <= 1:
        raise PortableError(f"--read-data-subset {text!r} must be above 0 and at most 100%")
    return frac


def fsck(store: Store, *, read_data: bool = False, subset: float | None = None, seed: int | None = None) -> FsckResult:
    """Every manifest's objects exist, every head names a manifest; optionally re-hash objects."""
    errors: list[str] = []
    warnings: list[str] = []
    try:
        store.check_store()
    except PortableError as exc:
        # Nothing else in a store of unknown format can be read meaningfully.
        return FsckResult(False, 0, 0, [f"config.json: {exc.one_line()}"])
    object_keys = store.backend.list("objects")
    sizes: dict[str, str] = {k.rsplit("/", 1)[-1]: k for k in object_keys}
    manifests = 0
    needed: dict[str, str] = {}
    pack_refs: dict[str, list[tuple[str, int, int, str]]] = {}
    for ws in store.workspaces():
        try:
            head, _ = store.read_head(ws)
        except PortableError as exc:
            errors.append(f"workspace {ws}: head: {exc}")
            continue
        keys = store.backend.list(manifests_prefix(ws))
        reachable = {(m.version) for m in _safe_history(store, ws, errors)}
        if head.version and head.version not in reachable:
            errors.append(f"workspace {ws}: head names version {head.version}, which cannot be read")
        for key in keys:
            try:
                version, _ = parse_manifest_key(key)
                manifest = store.read_manifest_key(key)
            except PortableError as exc:
                errors.append(f"{key}: {exc}")
                continue
            manifests += 1
            if version not in reachable or version > head.version:
                warnings.append(f"{key}: not in the history of {ws} (a writer that lost a race); harmless")
            for e in manifest.files:
                for h in e.object_keys():
                    needed.setdefault(h, f"{key} ({e.path})")
                if e.pack is not None:
                    pack_refs.setdefault(e.pack.pack, []).append((e.hash, e.pack.offset, e.pack.length, key))
    for h, where in sorted(needed.items()):
        if h not in sizes:
            errors.append(f"object {h} named by {where} is missing")
    indexes: dict[str, PackIndex] = {}
    for pack, refs in pack_refs.items():
        if pack not in sizes:
            continue
        try:
            indexes[pack] = store.get_index(pack)
        except PortableError as exc:
            errors.append(f"pack {pack}: index: {exc}")
            continue
        for h, o, n, key in refs:
            if o + n > indexes[pack].size:
                errors.append(f"{key}: blob {h[:16]}… at {o}+{n} runs past the end of pack {pack[:16]}…")
    read = 0
    if read_data:
        names = sorted(sizes)
        if subset is not None:
            rng = random.Random(seed)
            names = sorted(rng.sample(names, max(1, round(len(names) * subset)))) if names else []

        def check(h: str) -> str | None:
            data = store.backend.read(sizes[h])
            if digest(data) != h:
                return f"object {h} is corrupt: its bytes do not hash to its name"
            for bh, o, n, key in pack_refs.get(h, ()):
                if digest(data[o:o + n]) != bh:
                    return f"pack {h}: blob {bh} named by {key} is corrupt"
            return None

        with ThreadPoolExecutor(4) as pool:
            for problem in pool.map(check, names):
                read += 1
                if problem:
                    errors.append(problem)
    return FsckResult(not errors, manifests, len(object_keys), errors, warnings, read)


def _safe_history(store: Store, ws: str, errors: list[str]) -> list[Manifest]:
    try:
        return store.history(ws)
    except (PortableError, ManifestError) as exc:
        errors.append(f"workspace {ws}: history: {exc}")
        return []
