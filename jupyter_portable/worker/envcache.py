"""The worker's Python environment, rebuilt from the workspace's lockfile and cached in the store.

A worker on a fresh machine builds a virtual environment from the workspace's lockfile
(:mod:`jupyter_portable.engine.runtime.lockfile`); ``uv`` makes the venv and installs into it,
hard-linking from its cache beside the venvs. The first build of a lockfile is **cold**: pip
fetches (or builds) one wheel per requirement from a package index or find-links folder,
every wheel is stored as an object, and a *wheel index* names them. Every later build of
the same lockfile on the same kind of interpreter is **warm**: the wheels come from the
store alone, each hashed on the way in, and uv installs with ``--offline --no-index`` and no
configuration, so no package index is reached. On a machine the index is used only with the
digest the user's side sent (``worker/trust``, ``envprep``: it prepares and records the index on
every path), and a machine's own cold build publishes none (``build_env(pinned_only=True)``).

The wheel index's format is :mod:`.wheelindex`'s; uv and pip are run by :mod:`.installers`.

Write order is the store's (data before index): every wheel object; then the environment is
installed from exactly those wheels; only then the index, created once (``write_new``). A
worker that loses the race to create it keeps the other's. Read order: the index, then every
object, each verified before pip sees it; the venv is created only after that.

Index URLs may carry credentials (``https://user:token@host/simple``): they are never stored,
and every message and progress line has ``user:pass@`` in URLs replaced by ``***@``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from jupyter_portable.core.envplan import EnvChange, differences
from jupyter_portable.core.errors import ConflictError, IntegrityError, ObjectMissing, UsageError
from jupyter_portable.engine.runtime.lockfile import normalise, parse_lockfile
from jupyter_portable.store.repo import Store, digest, object_key
from jupyter_portable.worker.installers import (
    Progress,
    download_wheels,
    install_local,
    install_wheels,
    make_venv,
    pip_python,
    redact,
)
from jupyter_portable.worker.localwheels import LocalWheel, fetch_local
from jupyter_portable.worker.venvpack import tar_entries, unpack
from jupyter_portable.worker.wheelindex import Wheel, WheelIndex, check_covers, env_tag, index_key, read_index

_FETCHERS = 8
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class EnvBuild:
    """What :func:`build_env` did: ``kind`` is ``"cold"`` (from a package index) or ``"warm"`` (store only)."""

    kind: str
    seconds: float
    wheels: int
    bytes: int
    venv: Path
    python: Path
    lockfile: str
    env: str
    changes: tuple[EnvChange, ...] = ()  # how the installed environment differs from the lockfile, and why
    installed_from: str = "wheels"  # "archive": the index's one archive, unpacked; "wheels": uv installed each
    phases: tuple[tuple[str, float], ...] = ()  # where the seconds went, in order

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "seconds": round(self.seconds, 3), "wheels": self.wheels, "bytes": self.bytes,
                "venv": str(self.venv), "python": str(self.python), "lockfile": self.lockfile, "env": self.env,
                "changes": [c.to_json() for c in self.changes], "exact": not differences(self.changes),
                "installed_from": self.installed_from, "phases": {k: round(v, 3) for k, v in self.phases}}


def build_env(store: Store, lockfile: bytes, venv: Path, *, find_links: list[str] | None = None,
              index_url: str | None = None, python: str = sys.executable, local: Iterable[LocalWheel] = (),
              notes: Iterable[EnvChange] = (), expect: str | None = None, pinned_only: bool = False,
              progress: Progress | None = None) -> EnvBuild:
    """Build a virtual environment at ``venv`` from ``lockfile``, with its wheels cached in ``store``.

    Warm (the store holds this lockfile's wheels): nothing but the store is read. Cold: pip
    gets the wheels from ``index_url``/``find_links`` (pip's own configuration otherwise).
    pip's output goes to ``progress``. On any failure the venv is removed, never left half-built.
    ``local``: wheels built on the user's side (editable, path and git installs), installed last;
    ``notes``: what the user's side already knows is left out, carried into the record.
    ``expect``: the digest of the index the user's side prepared; the store's must match it.
    ``pinned_only`` (a worker on a machine): without ``expect`` the store's index is not read (anyone
    who can write the store may have planted it) and the cold build publishes none (no machine may
    trust a machine's build; the user's side prepares and records indexes, ``envprep``).
    """
    started = time.monotonic()
    say: Progress = progress or (lambda _line: None)
    venv = Path(venv).absolute()
    names = sorted(parse_lockfile(lockfile))
    if venv.is_symlink() or venv.exists() and (not venv.is_dir() or any(venv.iterdir())):
        raise UsageError(f"{venv} already exists and is not an empty folder",
                         hint="build the environment into a new folder, or remove that one")
    lockhash = digest(lockfile)
    env = env_tag(python)
    index = None if pinned_only and expect is None else read_index(store, lockhash, env, expect=expect)
    if expect is not None and index is None:
        raise ObjectMissing(f"{index_key(lockhash, env)}, which your side prepared for this machine, is not in "
                            f"{redact(store.url)}", hint="Continue again: your side prepares it anew")
    if index is not None and index.requirements is not None:
        # resolved for this interpreter on the user's side: install what it says, not the lockfile's pins
        names = sorted(normalise(r.split("==", 1)[0]) for r in index.requirements)
        lockfile = ("\n".join(index.requirements) + "\n").encode()
    if index is not None:
        check_covers(index.wheels, names, f"wheel index {index.key}",
                      f"delete {index.key} from the store; the next build is cold and writes it again")
    # the image's own builds kept (its torch): the venv sees the machine's site-packages
    system_site = index is not None and any(c.kind == "kept" for c in index.changes)
    owned = False  # from the moment the venv may exist, a failure removes it
    packed = index is not None and index.archive is not None
    phases: list[tuple[str, float]] = []
    lap = [time.monotonic()]

    def done(phase: str) -> None:
        now = time.monotonic()
        phases.append((phase, now - lap[0]))
        lap[0] = now

    try:
        venv.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{venv.name}-wheels-", dir=venv.parent) as tmp:
            # warm: the store's wheels are kept beside the venvs, so a second build on this machine
            # finds uv's cache of them filled and hard-links instead of unpacking again
            wheel_dir = venv.parent / "wheel-files" if index is not None else Path(tmp) / "wheels"
            wheel_dir.mkdir(exist_ok=True)
            if index is not None and index.archive is not None:
                wheels = index.wheels
                say(f"env cache: warm: {wheel_count(len(wheels))} of lockfile {lockhash[:12]} for {env}, installed "
                    f"once on your side: one archive ({_mib([index.archive])}) from {redact(store.url)}")
                for change in index.changes:
                    say(f"environment: {change.line()}")
                blob = _read_archive(store, index)
                done("fetch_s")
                owned = True
                py, members = _open_archive(index, blob, lambda: make_venv(python, venv, say, system_site=system_site))
                done("venv_s")
                try:
                    unpack(members, str(venv))
                except ValueError as exc:
                    raise IntegrityError(f"the environment archive of {index.key} cannot be unpacked: {exc}",
                                         hint=f"delete {index.key} from the store and Continue again") from exc
                del blob, members
                done("unpack_s")
            elif index is not None:
                wheels = index.wheels
                say(f"env cache: warm: {wheel_count(len(wheels))} ({_mib(wheels)}) of lockfile {lockhash[:12]} "
                    f"for {env}, from {redact(store.url)}")
                for change in index.changes:
                    say(f"environment: {change.line()}")
                _fetch(store, index, wheel_dir)
                done("fetch_s")
                owned = True
                py = make_venv(python, venv, say, system_site=system_site)
                done("venv_s")
            else:
                say(f"env cache: cold: no wheels of lockfile {lockhash[:12]} for {env} in {redact(store.url)} yet")
                owned = True
                py = make_venv(python, venv, say)
                lock_path = Path(tmp) / "lockfile.txt"
                lock_path.write_bytes(lockfile)
                files = download_wheels(pip_python(python, py), lock_path, bool(names), wheel_dir, find_links,
                                        index_url, say)
                check_covers((Wheel(p.name, 0, "") for p in files), names, "the wheels pip fetched",
                              "check the lockfile's requirements; pip's output above names what it got")
                say(f"storing {wheel_count(len(files))} in {redact(store.url)}")
                wheels = upload_wheels(store, files)
            if not packed:
                install_wheels(py, lockfile, wheels, wheel_dir, Path(tmp), say)
                done("install_s")
            local = list(local)
            if local:
                install_local(py, fetch_local(store, local, Path(tmp) / "local"), say)
                done("local_s")
            if index is None and not pinned_only:
                _publish(store, WheelIndex(lockhash, env, wheels), say)
    except BaseException as exc:
        if owned:
            shutil.rmtree(venv, ignore_errors=True)
        if isinstance(exc, OSError):
            raise UsageError(f"cannot build the environment at {venv}: {exc.strerror or exc}",
                             hint="check that its folder is writable and has free space") from exc
        raise
    return EnvBuild("cold" if index is None else "warm", time.monotonic() - started, len(wheels),
                    sum(w.size for w in wheels), venv, py, lockhash, env,
                    (*(index.changes if index is not None else ()), *(w.change() for w in local), *notes),
                    "archive" if packed else "wheels", tuple(phases))


def _mib(wheels: Iterable[Wheel]) -> str:
    return f"{sum(w.size for w in wheels) / 2**20:.1f} MiB"


def wheel_count(n: int) -> str:
    return f"{n} wheel" if n == 1 else f"{n} wheels"


def _parallel(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    todo = list(items)
    if len(todo) <= 1:
        return [fn(i) for i in todo]
    with ThreadPoolExecutor(min(_FETCHERS, len(todo))) as pool:
        return list(pool.map(fn, todo))


def _fetch(store: Store, index: WheelIndex, wheel_dir: Path) -> None:
    """Every wheel of ``index`` into ``wheel_dir``, each verified against its hash and size first."""
    def one(w: Wheel) -> None:
        try:
            data = store.get_object(w.hash, what=f"wheel {w.filename}")
        except ObjectMissing as exc:
            raise ObjectMissing(
                f"wheel {w.filename} (object {w.hash[:16]}…), named by wheel index {index.key}, is missing "
                f"from {redact(store.url)}",
                hint=f"delete {index.key} from the store; the next build is cold and fetches it again") from exc
        if len(data) != w.size:
            raise IntegrityError(f"wheel {w.filename} from {redact(store.url)} has {len(data)} bytes, "
                                 f"its index says {w.size}",
                                 hint=f"delete {index.key} from the store; the next build is cold")
        part = wheel_dir / f".{w.filename}.part"
        part.write_bytes(data)
        os.replace(part, wheel_dir / w.filename)

    def needed(w: Wheel) -> bool:
        kept = wheel_dir / w.filename
        return not (kept.is_file() and kept.stat().st_size == w.size and digest(kept.read_bytes()) == w.hash)

    _parallel(one, [w for w in index.wheels if needed(w)])


def _read_archive(store: Store, index: WheelIndex) -> bytes:
    """The index's archive as the store holds it, its size checked; :func:`_open_archive` checks
    its hash before anything in it is written."""
    assert index.archive is not None
    try:
        data = store.backend.read(object_key(index.archive.hash))
    except ObjectMissing as exc:
        raise ObjectMissing(f"the environment archive {index.archive.hash[:16]}…, named by {index.key}, is missing "
                            f"from {redact(store.url)}",
                            hint=f"delete {index.key} from the store and Continue again") from exc
    if len(data) != index.archive.size:
        raise IntegrityError(f"the environment archive of {index.key} has {len(data)} bytes, its index says "
                             f"{index.archive.size}", hint=f"delete {index.key} from the store and Continue again")
    return data


def _open_archive(index: WheelIndex, blob: bytes, make_venv: Callable[[], Path]
                  ) -> tuple[Path, list[tuple[str, bytes | memoryview | None, int]]]:
    """The venv's Python and the archive's members, three things done side by side: the venv
    made (a process), the archive hashed (BLAKE3 lets go of the interpreter) and its members listed
    (from its member table; an older archive's tar headers one by one). Nothing of the archive is written before
    its hash is its name: a tar that does not read is said only once the hash holds."""
    assert index.archive is not None
    with ThreadPoolExecutor(2) as pool:
        made = pool.submit(make_venv)
        hashed = pool.submit(digest, blob)
        bad: Exception | None = None
        members: list[tuple[str, bytes | memoryview | None, int]] = []
        try:
            members = list(tar_entries(blob))
        except Exception as exc:  # noqa: BLE001 - bytes not yet checked: the hash speaks first
            bad = exc
        if hashed.result() != index.archive.hash:
            raise IntegrityError(f"the environment archive of {index.key} is corrupt: its bytes do not hash to its "
                                 "name", hint=f"delete {index.key} from the store and Continue again")
        py = made.result()
    if bad is not None:
        raise IntegrityError(f"the environment archive of {index.key} cannot be unpacked: {bad}",
                             hint=f"delete {index.key} from the store and Continue again") from bad
    return py, members


def upload_wheels(store: Store, files: list[Path]) -> tuple[Wheel, ...]:
    def one(path: Path) -> Wheel:
        data = path.read_bytes()
        return Wheel(path.name, len(data), store.put_object(data))

    return tuple(sorted(_parallel(one, files), key=lambda w: w.filename))


def _publish(store: Store, index: WheelIndex, say: Progress) -> None:
    try:
        store.backend.write_new(index.key, index.to_bytes())
    except ConflictError:
        say(f"another worker cached this lockfile first; keeping its {index.key}")
        return
    say(f"cached {wheel_count(len(index.wheels))} ({_mib(index.wheels)}) as {index.key}")


__all__ = ["EnvBuild", "build_env", "upload_wheels", "wheel_count"]
