"""The notebook's environment for a bare cloud machine, made ready on the user's side.

Before the worker starts, the user's side knows the machine's interpreter (the bootstrap's
probe) and can reach a package index; the machine may reach none. So the workspace's lockfile
is resolved here for the machine's Python and platform, with the recorded versions as
preferences (``worker/resolve``, the rules in ``core/envplan``), every wheel goes into the store
and a *wheel index* names them (its format in ``worker/envcache``); packages installed from a
path or URL are built into wheels (``worker/localwheels``). The machine then builds the
environment warm, from the store alone, checking the index against the digest sent to it
(``worker/trust``). In ``exact`` mode any difference refuses the machine instead.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_portable.compute.base import Allocation
from jupyter_portable.core.envplan import EnvChange, changes, split
from jupyter_portable.core.errors import (
    AdmissionRefused,
    ConflictError,
    IntegrityError,
    LaunchFailed,
    PortableError,
    UsageError,
)
from jupyter_portable.engine.runtime.lockfile import parse_lockfile
from jupyter_portable.store.repo import Store, digest
from jupyter_portable.worker import trust, venvpack
from jupyter_portable.worker.envbuild import pinned_only
from jupyter_portable.worker.envcache import upload_wheels, wheel_count
from jupyter_portable.worker.installers import Progress, redact
from jupyter_portable.worker.localwheels import build_local
from jupyter_portable.worker.resolve import Platform, download, resolve, why_not
from jupyter_portable.worker.wheelindex import ARCHIVE_NAME, Wheel, WheelIndex, check_covers, read_index_bytes
from jupyter_portable.worker.wheelset import FIND_LINKS_ENV, index_sources


@dataclass(frozen=True, slots=True)
class Prepared:
    """What :func:`prepare_index` found or made: the index for the machine, and whether it was cached."""

    index: WheelIndex
    warm: bool
    digest: str  # of the index's bytes, held on the user's side: the worker checks the store's against it

    @property
    def changes(self) -> tuple[EnvChange, ...]:
        return self.index.changes

    def to_json(self) -> dict[str, Any]:
        return {"key": self.index.key, "warm": self.warm, "wheels": len(self.index.wheels), "digest": self.digest,
                "exact": not self.index.changes, "changes": [c.to_json() for c in self.index.changes]}


class NotExact(UsageError):
    """``--environment exact``: the recorded versions do not all fit the machine."""


def prepare_index(store: Store, lockfile: bytes, env: str, platform: Platform, *, image: Mapping[str, str],
                  sources: list[str], exact: bool = False, refused: Iterable[EnvChange] = (),
                  progress: Progress | None = None) -> Prepared:
    """On the user's side, before the worker builds: the wheel index of ``lockfile`` for the machine
    ``env``/``platform``, resolved with the recorded versions preferred and every wheel in the store.

    The machine needs no package index: it builds warm from what this leaves in the store. The
    image's compatible builds of ``IMAGE_WINS`` frameworks (``image``: the machine's packages) are
    kept, user-platform-only packages left out, and every difference recorded in the index.
    ``exact`` refuses (:class:`NotExact`, listing them) instead of installing any difference.
    ``refused`` are packages already known not to come (a local package that did not build): in
    ``exact`` mode they refuse the machine too.
    """
    say: Progress = progress or (lambda _line: None)
    lockhash = digest(lockfile)
    refused = list(refused)
    got = read_index_bytes(store, lockhash, env)
    found = got[0] if got is not None else None
    if got is not None and found is not None and found.requirements is not None \
            and trust.check(store.url, found.key, got[1]):
        if exact and (found.changes or refused):
            raise _not_exact([*found.changes, *refused], env)
        return Prepared(found, True, digest(got[1]))
    pins, unpinned = pins_of(lockfile)
    part = split(pins, image)
    resolved = resolve(sorted(part.resolve), part.resolve, platform, sources,
                       what="the notebook's environment (the workspace's lockfile)",
                       hint="the lockfile's packages must be on the package index (or a --find-links folder) for "
                            "the machine's Python; choose an image whose Python matches the one you work in")
    kept = {c.name for c in part.kept}
    for name in kept:
        resolved.pop(name, None)  # asked for by another package, and given by the image
    recorded = dict(part.resolve)
    reasons = {n: why_not(n, v, platform, sources) for n, v in recorded.items() if resolved.get(n, v) != v
               or n not in resolved}
    diffs = [*part.kept, *part.left_out,
             *(EnvChange(n, None, None, "not-found", "left-out", "installed from a local path, a URL or in "
                         "editable mode: it is not on a package index") for n in unpinned),
             *changes(recorded, resolved, reasons)]
    diffs.sort(key=lambda c: c.name)
    if exact and (diffs or refused):
        raise _not_exact([*diffs, *refused], env)
    for change in diffs:
        say(f"environment for {env}: {change.line()}")
    with tempfile.TemporaryDirectory(prefix="jp-env-wheels-") as tmp:
        say(f"fetching {wheel_count(len(resolved))} of the workspace's environment for {env}")
        files = download(resolved, platform, Path(tmp), sources, what="the notebook's environment",
                         python=sys.executable)
        check_covers((Wheel(p.name, 0, "") for p in files), resolved, "the wheels pip fetched",
                      "check the lockfile's requirements")
        say(f"storing {wheel_count(len(files))} in {redact(store.url)}")
        wheels = upload_wheels(store, files)
        archive = lay_out(store, files, layout_key(wheels, platform), platform, Path(tmp) / "layout", say)
    index = WheelIndex(lockhash, env, wheels, tuple(f"{n}=={v}" for n, v in sorted(resolved.items())), tuple(diffs),
                       archive)
    if got is not None:
        # an index this computer never recorded (another's, or planted): used only if it names exactly
        # the wheels fetched here just now, and the archive laid out here from them (or none)
        if found is not None and sorted((w.filename, w.hash) for w in found.wheels) == \
                sorted((w.filename, w.hash) for w in wheels) and found.requirements == index.requirements \
                and (found.archive is None or found.archive == archive):
            return Prepared(found, False, trust.record(store.url, found.key, got[1]))
        raise IntegrityError(f"{index.key} in the store names other wheels (or another archive of them) than the "
                             "ones fetched here for the same lockfile and machine",
                             hint=f"delete {index.key} from the store and Continue again")
    data = index.to_bytes()
    try:
        store.backend.write_new(index.key, data)
    except ConflictError:
        # another Continue stored it first: the same wheels, or it is refused
        theirs = read_index_bytes(store, lockhash, env)
        if theirs is None or sorted((w.filename, w.hash) for w in theirs[0].wheels) != \
                sorted((w.filename, w.hash) for w in wheels) or theirs[0].archive not in (None, archive):
            raise IntegrityError(f"{index.key} was written by another at the same time, with other wheels",
                                 hint=f"delete {index.key} from the store and Continue again") from None
        return Prepared(theirs[0], True, trust.record(store.url, index.key, theirs[1]))
    say(f"cached the environment for {env} as {index.key}; later machines of this kind are warm")
    return Prepared(index, False, trust.record(store.url, index.key, data))


ARCHIVE_MAX_BYTES = 2 * 2**30  # installed; past it the machine installs each wheel (and memory holds no tar of it)


def lay_out(store: Store, files: list[Path], key: str, platform: Platform, dest: Path,
            say: Progress) -> Wheel | None:
    """The environment installed once here for the machine's Python and platform, one uncompressed tar
    in the store (a machine unpacks it in one pass; compressing would cost it more than it saves on
    a store it reads at disk speed), or None where it cannot be made: the machine installs each wheel.
    ``key`` (:func:`layout_key`): an archive laid out here before for it is used again."""
    if not files:
        return None
    known = trust.laid_out().get(key)
    if known is not None and store.has_object(known[0]):
        # the same wheels make the same bytes; the machine checks them against the hash named here
        say(f"the environment's archive laid out here before ({known[1] / 2**20:.1f} MiB) is in the store: "
            "used again")
        return Wheel(ARCHIVE_NAME, known[1], known[0])
    try:
        blob = venvpack.build(files, platform.python_version, platform.uv_platform, dest, compress=False,
                              max_bytes=ARCHIVE_MAX_BYTES)
    except PortableError as exc:
        say(f"no environment archive ({exc}): the machine installs each wheel")
        return None
    h = digest(blob)
    if not store.has_object(h):
        store.put_object(blob, h)
    trust.remember_layout(key, h, len(blob))
    say(f"laid out the environment once here: one archive of {len(blob) / 2**20:.1f} MiB")
    return Wheel(ARCHIVE_NAME, len(blob), h)


def layout_key(wheels: Iterable[Wheel], platform: Platform) -> str:
    """What names a layout (``wheels``: as stored, each named by the hash of its bytes): the
    machine's Python and platform, and each wheel. A lockfile recorded on a machine names the
    versions installed there, in other bytes than the lockfile it was built from: the wheels,
    and so the archive, are the same."""
    parts = sorted((w.filename, w.hash) for w in wheels)
    # and how this computer lays out (a layout of an older way, without compiled modules, is made again)
    return digest(json.dumps([platform.python_version, platform.uv_platform, parts, venvpack.LAYOUT]).encode())


def pins_of(lockfile: bytes) -> tuple[dict[str, str], list[str]]:
    pins: dict[str, str] = {}
    other: list[str] = []
    for name, line in parse_lockfile(lockfile).items():
        if "==" in line and " @ " not in line and not line.startswith("-e"):
            pins[name] = line.split("==", 1)[1].split(";")[0].strip()
        else:
            other.append(name)
    return pins, other


def _not_exact(diffs: Iterable[EnvChange], env: str) -> NotExact:
    items = list(diffs)
    return NotExact(f"the recorded environment does not fit the machine ({env}) exactly: "
                    + "; ".join(c.line() for c in items[:12]) + (f"; and {len(items) - 12} more" if len(items) > 12
                                                                  else ""),
                    hint="choose a machine whose Python matches yours, or allow the nearest compatible versions "
                         "(environment 'auto')", changes=[c.to_json() for c in items])


def prepare_environment(environment: dict[str, Any], machine: Any, *, store: str, workspace_id: str, version: int,
                        allocation: Allocation, progress: Callable[[str], None] | None,
                        pins_decide: bool = False) -> dict[str, Any]:
    """The notebook's environment for a bootstrapped machine, made ready on the user's side: its
    lockfile resolved for the machine's interpreter (``machine``, the bootstrap's probe) and every
    wheel put in the store, so the machine builds it warm without a package index. In ``exact``
    mode a difference refuses the machine. Returns the environment the worker gets.
    ``pins_decide``: a machine whose Python the worker already runs (the local market, an ssh host,
    an image's): in ``auto`` mode its Python is used when it has every pinned version, as the
    worker's own check (``envbuild.image_will_do``) decides, whatever was installed from a path."""
    mode = environment.get("mode", "auto")
    if mode == "image" or machine is None:
        return environment
    st = Store.open(store)
    runtime = st.read_manifest(workspace_id, version).runtime or {}
    lock_hash = runtime.get("lockfile")
    if not lock_hash:
        return environment
    recorded_py = str(runtime.get("python") or "")
    other_python = bool(recorded_py) and recorded_py.split(".")[:2] != machine.version.split(".")[:2]
    python_line = (f"the work ran on Python {recorded_py}, the machine's python3 is "
                   f"{machine.full_version or machine.version}")
    # the worker builds from the lockfile's NAME==VERSION lines alone (envbuild.pinned_only): the
    # index is keyed by those bytes; what is installed from a path or URL is built into wheels here
    raw = st.get_object(lock_hash, what="the lockfile")
    lockfile, unpinned = pinned_only(raw)
    # this package travels as the worker's own wheel, made from the code that runs here (bootstrap)
    unpinned = [n for n in unpinned if n != "jupyter-portable"]
    image = dict(machine.packages)
    pins, _ = pins_of(lockfile)
    if mode == "auto" and (pins_decide or not unpinned) and all(image.get(n) == v for n, v in pins.items()):
        return environment  # the machine's Python already has the recorded versions: the worker uses it
    lines = parse_lockfile(raw)
    built, not_built = build_local({n: lines[n] for n in unpinned}, st,
                                   python_version=machine.full_version or machine.version, machine=machine.machine,
                                   progress=progress)
    try:
        prepared = prepare_index(st, lockfile, machine.tag, machine.wheel_platform(), image=image,
                                 sources=index_sources(None, environment.get("index_url"), None)
                                 + [a for link in environment.get("find_links") or () for a in ("--find-links", link)],
                                 exact=mode == "exact", refused=not_built, progress=progress)
    except NotExact as exc:
        raise AdmissionRefused(f"{allocation.allocation_id}: {python_line + '; ' if other_python else ''}{exc}",
                               provider=allocation.provider, offer=allocation.offer_id, hint=exc.hint,
                               changes=exc.context.get("changes")) from exc
    except LaunchFailed as exc:
        raise LaunchFailed(f"{allocation.allocation_id}: {exc}", provider=allocation.provider,
                           offer=allocation.offer_id,
                           hint=exc.hint or f"set {FIND_LINKS_ENV} to a folder with the lockfile's wheels") from exc
    if mode == "exact" and other_python:
        raise AdmissionRefused(f"{allocation.allocation_id}: {python_line} (environment 'exact')",
                               provider=allocation.provider, offer=allocation.offer_id,
                               hint=f"choose an image with Python {'.'.join(recorded_py.split('.')[:2])}, or allow "
                                    "the nearest compatible versions (environment 'auto')")
    allocation.details["environment"] = {**prepared.to_json(), "built": [w.to_json() for w in built],
                                         "not_built": [c.to_json() for c in not_built]}
    return {**environment, "mode": "lockfile", "chosen_by": mode, "prepared": prepared.index.key,
            "index_digest": prepared.digest,
            "built": [w.to_json() for w in built], "not_built": [c.to_json() for c in not_built]}


__all__ = ["NotExact", "Prepared", "pins_of", "prepare_environment", "prepare_index"]
