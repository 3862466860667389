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

Layout, beside the store's other keys::

    objects/<h[:2]>/<h>           one wheel file, <h> = BLAKE3 of its bytes
    wheels/<l>/<env>.json         wheel index of lockfile <l> for interpreter <env>

``<l>`` is the BLAKE3 hash of the lockfile's exact bytes (its ``NAME==VERSION`` lines, as the
worker builds from them). ``<env>`` is what a wheel must fit,
``<implementation>-<major>.<minor>.<micro><abiflags>-<platform>`` lowercased, e.g.
``cpython-3.11.2-linux-x86_64``: the lockfile alone does not say which of numpy's wheels a
machine needs, nor whether a pin's ``Requires-Python`` admits the machine's micro version, so
two interpreters keep two indexes.

A wheel index is one JSON object with exactly these fields (schema 1, written by a machine's
own cold build before, lacks ``requirements``, ``changes`` and ``archive``; schema 2 lacks
``archive``; both are still read)::

    {
      "format": "jupyter-portable.wheelindex",
      "schema": 3,
      "lockfile": "<l>",
      "env": "cpython-3.10.13-linux-x86_64",
      "requirements": ["ipython==8.39.0", "tinypkg==1.0"],
      "changes": [{"name": "ipython", "recorded": "9.18.1", "installed": "8.39.0",
                   "why": "requires-python", "kind": "changed", "detail": "..."}],
      "wheels": [
        {"filename": "tinypkg-1.0-py3-none-any.whl", "size": 1234, "hash": "<h>"}
      ],
      "archive": {"filename": "venv.tar", "size": 20480, "hash": "<h>"}
    }

``archive`` (or ``null``) names one object: exactly ``wheels`` installed once on the user's
side for ``env`` and laid out as a venv (``worker/venvpack``), an uncompressed tar of regular
files and folders. A new machine unpacks it into a fresh venv in one pass instead of fetching
and installing each wheel; it is trusted as part of the index (whose digest the worker checks),
and the user's side confirms an index it never recorded only when the archive it lays out
itself is the same bytes. Without one (an index made before, a machine's own cold build, an
environment past ``envprep.ARCHIVE_MAX_BYTES`` installed) each wheel is installed.

``requirements`` is what the machine installs (``null``: the lockfile's own pins, as a machine's
cold build made them); resolved on the user's side for ``env`` with the recorded versions
preferred (``envprep.prepare_index``), it differs from the lockfile exactly as ``changes`` says (the
environment change record of ``docs/store-format.md`` section 4.8). ``wheels`` is sorted by
``filename`` and holds one wheel for each of ``requirements`` and no other (project names
compared PEP 503-normalised). ``filename`` is a PEP 427 wheel file name and one path segment;
``size`` is the wheel's length in bytes; ``hash`` names the object holding it. Any other format
or schema, a missing or unknown field, a hash that is not 64 lowercase hex digits, or a
``lockfile``/``env`` other than the key's is refused with :class:`ManifestError`; a wheel whose
bytes do not hash to its object or are not ``size`` long, with :class:`IntegrityError`. A
refused index is never repaired silently: the error names its key, and deleting it makes the
next build cold.

Write order is the store's (data before index): every wheel object; then the environment is
installed from exactly those wheels; only then the index, created once (``write_new``). A
worker that loses the race to create it keeps the other's. Read order: the index, then every
object, each verified before pip sees it; the venv is created only after that.

Index URLs may carry credentials (``https://user:token@host/simple``): they are never stored,
and every message and progress line has ``user:pass@`` in URLs replaced by ``***@``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from jupyter_portable.core.envplan import EnvChange, differences
from jupyter_portable.core.errors import ConflictError, IntegrityError, ManifestError, ObjectMissing, UsageError
from jupyter_portable.core.manifest import check_hash
from jupyter_portable.engine.runtime.lockfile import normalise, parse_lockfile
from jupyter_portable.store.repo import Store, digest, object_key
from jupyter_portable.worker.localwheels import LocalWheel, fetch_local
from jupyter_portable.worker.venvpack import tar_entries, unpack

INDEX_FORMAT = "jupyter-portable.wheelindex"
INDEX_SCHEMA = 3  # 2 adds what is installed (requirements) and how it differs from the lockfile (changes);
# 3 the environment installed once on the user's side, as one archive (archive)
_INDEX_FIELDS = frozenset({"format", "schema", "lockfile", "env", "wheels"})
_INDEX_FIELDS_2 = _INDEX_FIELDS | {"requirements", "changes"}
_INDEX_FIELDS_3 = _INDEX_FIELDS_2 | {"archive"}
_ARCHIVE_FIELDS = frozenset({"filename", "size", "hash"})
ARCHIVE_NAME = "venv.tar"
_WHEEL_FIELDS = frozenset({"filename", "size", "hash"})
# PEP 427: {distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl, in one path segment.
_WHEEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.]*(?:-[A-Za-z0-9_.+!]+){4,5}\.whl")
_ENV = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
_REQUIREMENT = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?==[A-Za-z0-9][A-Za-z0-9.+!_-]{0,99}")
_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")
_FETCHERS = 8
_TAIL = 60
# Where pip names the requirement it failed on, most specific first.
_PIP_PACKAGE = (
    re.compile(r"No matching distribution found for (\S+)"),
    re.compile(r"satisfies the requirement (\S+)"),
    re.compile(r"Failed building wheel for (\S+)"),
    re.compile(r"Failed to build (\S+)"),
    re.compile(r"Could not build wheels for (\S+)"),
)
_ENV_PROBE = (
    "import sys, sysconfig; v = sys.version_info; "
    "print('%s-%d.%d.%d%s-%s' % (sys.implementation.name, v[0], v[1], v[2], getattr(sys, 'abiflags', ''), "
    "sysconfig.get_platform()))"
)

Progress = Callable[[str], None]
T = TypeVar("T")
R = TypeVar("R")


def redact(text: str) -> str:
    """``text`` with the ``user:pass@`` of every URL replaced by ``***@``."""
    return _CREDENTIALS.sub("***@", text)


def index_key(lockhash: str, env: str) -> str:
    """The store key of the wheel index of lockfile hash ``lockhash`` on interpreter ``env``."""
    check_hash(lockhash, "lockfile hash")
    if not _ENV.fullmatch(env):
        raise ManifestError(f"interpreter tag {env!r} is not valid")
    return f"wheels/{lockhash}/{env}.json"


def env_tag(python: str = sys.executable) -> str:
    """What a wheel must fit on interpreter ``python``, e.g. ``cpython-3.11.2-linux-x86_64`` (the micro
    version too: a package's requires-python may admit 3.11.7 and not 3.11.2)."""
    try:
        proc = subprocess.run([python, "-I", "-c", _ENV_PROBE], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"cannot run the interpreter {python}: {exc}",
                         hint="pass the path of a working Python 3 interpreter") from exc
    tag = re.sub(r"[^a-z0-9._-]", "_", proc.stdout.strip().lower())
    if proc.returncode != 0 or not _ENV.fullmatch(tag):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"could not ask {python} what wheels it takes (exit {proc.returncode}): {last}",
                         hint="pass the path of a working Python 3 interpreter")
    return tag


@dataclass(frozen=True, slots=True)
class Wheel:
    """One cached wheel file: its name, size and the object that holds its bytes."""

    filename: str
    size: int
    hash: str

    @property
    def project(self) -> str:
        """The PEP 503-normalised project name from the file name."""
        return normalise(self.filename.split("-", 1)[0])


@dataclass(frozen=True, slots=True)
class WheelIndex:
    """Which wheels build the environment of one lockfile on one kind of interpreter."""

    lockfile: str
    env: str
    wheels: tuple[Wheel, ...]
    requirements: tuple[str, ...] | None = None  # NAME==VERSION installed; None: the lockfile's own (schema 1)
    changes: tuple[EnvChange, ...] = ()
    archive: Wheel | None = None  # the wheels installed once on the user's side, one tar (worker/venvpack)

    @property
    def key(self) -> str:
        return index_key(self.lockfile, self.env)

    def to_bytes(self) -> bytes:
        return json.dumps({
            "format": INDEX_FORMAT, "schema": INDEX_SCHEMA, "lockfile": self.lockfile, "env": self.env,
            "requirements": list(self.requirements) if self.requirements is not None else None,
            "changes": [c.to_json() for c in self.changes],
            "wheels": [{"filename": w.filename, "size": w.size, "hash": w.hash}
                       for w in sorted(self.wheels, key=lambda w: w.filename)],
            "archive": {"filename": self.archive.filename, "size": self.archive.size, "hash": self.archive.hash}
            if self.archive is not None else None,
        }, indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, lockfile: str, env: str) -> "WheelIndex":
        """Parse and strictly validate the index stored for ``lockfile`` and ``env``."""
        key = index_key(lockfile, env)
        where = f"wheel index {key}"
        hint = f"delete {key} from the store; the next build is cold and writes it again"
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{where} is not valid JSON: {exc}", hint=hint) from exc
        try:
            schema = obj.get("schema") if isinstance(obj, dict) else None
            _fields(obj, _INDEX_FIELDS_3 if schema == 3 else _INDEX_FIELDS_2 if schema == 2 else _INDEX_FIELDS, where)
            if obj["format"] != INDEX_FORMAT or not _is_int(schema) or schema not in (1, 2, INDEX_SCHEMA):
                raise ManifestError(f"{where} has format {obj['format']!r} schema {obj['schema']!r}; this package "
                                    f"reads {INDEX_FORMAT!r} schema 1 to {INDEX_SCHEMA}")
            requirements: tuple[str, ...] | None = None
            changes: tuple[EnvChange, ...] = ()
            archive: Wheel | None = None
            if schema == 3 and obj["archive"] is not None:
                a = _fields(obj["archive"], _ARCHIVE_FIELDS, f"the archive of {where}")
                if a["filename"] != ARCHIVE_NAME or not _is_int(a["size"]) or a["size"] < 0:
                    raise ManifestError(f"{where}: malformed archive entry {a!r:.200}")
                archive = Wheel(ARCHIVE_NAME, a["size"], check_hash(a["hash"], f"{where}: the archive's hash"))
            if schema in (2, 3):
                reqs = obj["requirements"]
                if reqs is not None and (not isinstance(reqs, list) or not all(
                        isinstance(r, str) and _REQUIREMENT.fullmatch(r) for r in reqs)):
                    raise ManifestError(f"{where}: requirements must be a list of NAME==VERSION lines")
                requirements = tuple(reqs) if reqs is not None else None
                if not isinstance(obj["changes"], list):
                    raise ManifestError(f"{where}: changes must be a list")
                changes = tuple(EnvChange.from_json(c, where) for c in obj["changes"])
            if obj["lockfile"] != lockfile or obj["env"] != env:
                raise ManifestError(f"{where} names lockfile {str(obj['lockfile'])[:80]!r} "
                                    f"and env {str(obj['env'])[:80]!r}, not its own")
            if not isinstance(obj["wheels"], list):
                raise ManifestError(f"{where}: wheels must be a list")
            wheels = tuple(_wheel(w, where) for w in obj["wheels"])
            names = [w.filename for w in wheels]
            if names != sorted(set(names)):
                raise ManifestError(f"{where}: wheels must be sorted by filename, each once")
        except ManifestError as exc:
            raise ManifestError(str(exc), hint=hint) from exc
        return cls(lockfile, env, wheels, requirements, changes, archive)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fields(obj: object, required: frozenset[str], what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ManifestError(f"{what} must be a JSON object")
    if missing := required - obj.keys():
        raise ManifestError(f"{what} lacks {', '.join(sorted(missing))}")
    if extra := obj.keys() - required:
        raise ManifestError(f"{what} has unknown field(s) {', '.join(sorted(map(str, extra)))[:200]}")
    return obj


def _wheel(obj: object, where: str) -> Wheel:
    fields = _fields(obj, _WHEEL_FIELDS, f"a wheel of {where}")
    name, size = fields["filename"], fields["size"]
    if not isinstance(name, str) or not _WHEEL_NAME.fullmatch(name):
        raise ManifestError(f"{where} names {str(name)[:80]!r}, which is not a wheel file name")
    if not _is_int(size) or size < 0:
        raise ManifestError(f"{where}: the size of {name} must be a non-negative integer, got {size!r}")
    return Wheel(name, size, check_hash(fields["hash"], f"{where}: the hash of {name}"))


def check_covers(wheels: Iterable[Wheel], names: Iterable[str], where: str, hint: str) -> None:
    """Exactly one wheel for each requirement of the lockfile, and no other."""
    projects = [w.project for w in wheels]
    wanted = set(names)
    missing = sorted(wanted - set(projects))
    extra = sorted(set(projects) - wanted)
    twice = sorted({p for p in projects if projects.count(p) > 1})
    if missing or extra or twice:
        parts = [f"{label} {', '.join(items[:8])}" for label, items in
                 (("no wheel for", missing), ("wheels the lockfile does not list:", extra),
                  ("more than one wheel for", twice)) if items]
        raise ManifestError(f"{where} does not match the lockfile: {'; '.join(parts)}", hint=hint)


def read_index(store: Store, lockhash: str, env: str, *, expect: str | None = None) -> WheelIndex | None:
    """The validated wheel index of ``lockhash`` on ``env``, or None if none is cached. ``expect``: the
    digest of its bytes the user's side holds (``worker/trust``); anything else is refused."""
    found = read_index_bytes(store, lockhash, env)
    if found is None:
        return None
    if expect is not None and digest(found[1]) != expect:
        key = index_key(lockhash, env)
        raise IntegrityError(f"{key} in the store is not the index your side prepared for this machine: its bytes "
                             f"hash to {digest(found[1])[:16]}…, your side holds {expect[:16]}…",
                             hint=f"delete {key} from the store and Continue again: your side prepares it anew")
    return found[0]


def read_index_bytes(store: Store, lockhash: str, env: str) -> tuple[WheelIndex, bytes] | None:
    """The validated wheel index and its exact bytes, or None."""
    try:
        data = store.backend.read(index_key(lockhash, env))
    except ObjectMissing:
        return None
    return WheelIndex.from_bytes(data, lockfile=lockhash, env=env), data


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
                py, members = _open_archive(index, blob, lambda: _make_venv(python, venv, say, system_site=system_site))
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
                py = _make_venv(python, venv, say, system_site=system_site)
                done("venv_s")
            else:
                say(f"env cache: cold: no wheels of lockfile {lockhash[:12]} for {env} in {redact(store.url)} yet")
                owned = True
                py = _make_venv(python, venv, say)
                lock_path = Path(tmp) / "lockfile.txt"
                lock_path.write_bytes(lockfile)
                files = _download(_pip_python(python, py), lock_path, bool(names), wheel_dir, find_links, index_url,
                                  say)
                check_covers((Wheel(p.name, 0, "") for p in files), names, "the wheels pip fetched",
                              "check the lockfile's requirements; pip's output above names what it got")
                say(f"storing {wheel_count(len(files))} in {redact(store.url)}")
                wheels = upload_wheels(store, files)
            if not packed:
                _install(py, lockfile, wheels, wheel_dir, Path(tmp), say)
                done("install_s")
            local = list(local)
            if local:
                _install_local(py, fetch_local(store, local, Path(tmp) / "local"), say)
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


def time_cold_and_warm(store: Store, lockfile: bytes, workdir: Path, find_links: list[str] | None, *,
                       index_url: str | None = None, python: str = sys.executable,
                       progress: Progress | None = None) -> dict[str, Any]:
    """Build ``lockfile`` cold (wheels from ``find_links``/``index_url``) then warm (store only), in ``workdir``.

    Returns both builds and their seconds; ``speedup`` is cold seconds over warm seconds.
    ``store`` must not yet cache this lockfile, or the first build would not be cold.
    """
    env = env_tag(python)
    if read_index(store, digest(lockfile), env) is not None:
        raise UsageError(f"{redact(store.url)} already caches the wheels of this lockfile, so no build would be cold",
                         hint="time against a fresh store")
    work = Path(workdir)
    cold = build_env(store, lockfile, work / "venv-cold", find_links=find_links, index_url=index_url,
                     python=python, progress=progress)
    warm = build_env(store, lockfile, work / "venv-warm", python=python, progress=progress)
    return {
        "cold_s": round(cold.seconds, 3), "warm_s": round(warm.seconds, 3),
        "speedup": round(cold.seconds / warm.seconds, 2) if warm.seconds > 0 else None,
        "wheels": cold.wheels, "bytes": cold.bytes, "cold": cold.to_json(), "warm": warm.to_json(),
    }


# -- the steps -------------------------------------------------------------------------------


def _venv_python(venv: Path) -> Path:
    return venv / "Scripts" / "python.exe" if os.name == "nt" else venv / "bin" / "python"


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


def _uv() -> str | None:
    """uv's binary (the ``uv`` package, a dependency of this one), or None where it is missing."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        pass
    # a bootstrapped worker's venv links the uv binary beside its Python (worker/bootstrap.py)
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def _uv_env(venv: Path) -> dict[str, str]:
    """uv's environment: its cache beside the venvs (same file system, so installs hard-link from it),
    no user configuration, never a downloaded Python."""
    return {**os.environ, "UV_CACHE_DIR": str(venv.parent / "uv-cache"), "UV_NO_CONFIG": "1",
            "UV_PYTHON_DOWNLOADS": "never", "UV_LINK_MODE": "hardlink"}


def _make_venv(python: str, venv: Path, say: Progress, *, system_site: bool = False) -> Path:
    uv = _uv()
    cmd = [uv, "venv", "--quiet", "--python", python, str(venv)] if uv else [python, "-m", "venv", str(venv)]
    if system_site:
        cmd.insert(2, "--system-site-packages")
    rc, tail = _run(cmd, say, _uv_env(venv) if uv else dict(os.environ))
    py = _venv_python(venv)
    if rc != 0 or not py.exists():
        reason = next((ln for ln in reversed(tail) if ln.strip()), "no output")
        raise UsageError(f"`{' '.join(cmd[:2])} ... {venv}` failed (exit {rc}): {reason}",
                         hint="install Python's venv module (Debian: apt-get install python3-venv), "
                              "or pass another interpreter")
    return py


def _pip_python(python: str, venv_python: Path) -> Path:
    """A Python that has pip, to fetch the cold build's wheels: the new venv's (``python -m venv``
    seeds it), else the interpreter the venv is made from."""
    for candidate in (venv_python, Path(python)):
        if subprocess.run([str(candidate), "-c", "import pip"], capture_output=True).returncode == 0:
            return candidate
    raise UsageError(f"neither {venv_python} nor {python} has pip, which fetches the wheels of a cold build",
                     hint=f"install pip for {python}, or build this lockfile once where pip is")


def _download(py: Path, lock_path: Path, any_requirement: bool, wheel_dir: Path, find_links: list[str] | None,
              index_url: str | None, say: Progress) -> list[Path]:
    """One wheel per requirement of the lockfile into ``wheel_dir`` (built from an sdist where need be)."""
    if not any_requirement:
        return []
    # --no-deps: the lockfile is already the whole closure; resolving again could only drift.
    args = ["wheel", "--no-deps", "--disable-pip-version-check", "--no-input", "--wheel-dir", str(wheel_dir),
            "-r", str(lock_path)]
    if index_url:
        args += ["--index-url", index_url]
    for link in find_links or ():
        args += ["--find-links", link]
    _pip(py, args, say, dict(os.environ), "fetching the lockfile's wheels",
         "check that {pkg} is published for this interpreter at the package index, "
         "or pass --find-links/--index-url where it is")
    files = sorted(p for p in wheel_dir.iterdir() if p.is_file())
    odd = [p.name for p in files if not _WHEEL_NAME.fullmatch(p.name)]
    if odd:
        raise UsageError(f"pip left files that are not wheels: {', '.join(odd[:5])}",
                         hint="check the lockfile's requirements")
    return files


def _install(py: Path, lockfile: bytes, wheels: Iterable[Wheel], wheel_dir: Path, tmp: Path, say: Progress) -> None:
    """Install exactly the wheels in ``wheel_dir``, offline: no index, no pip configuration."""
    by_project = {w.project: w for w in wheels}
    if not by_project:
        return
    lines = []
    for name, line in parse_lockfile(lockfile).items():
        if line.startswith("-e ") or " @ " in line:
            # A direct URL (VCS, archive, local folder) would be fetched again: point at its wheel instead.
            lines.append(str(wheel_dir / by_project[name].filename))
        else:
            lines.append(line)  # NAME==VERSION: pip checks the pin against the wheel it finds
    reqs = tmp / "install.txt"
    reqs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    uv = _uv()
    if uv:
        # NAME==VERSION is checked against the wheel found; hard-linked from uv's cache beside the venvs
        say("$ uv pip install --offline --no-index --no-deps --find-links WHEELS -r LOCKFILE")
        rc, tail = _run([uv, "pip", "install", "--quiet", "--offline", "--no-index", "--no-deps", "--python", str(py),
                         "--find-links", str(wheel_dir), "-r", str(reqs)], say, _uv_env(py.parent.parent))
        if rc != 0:
            reason = next((ln for ln in reversed(tail) if ln.strip()), "no output")
            raise UsageError(f"uv failed installing the cached wheels (exit {rc}): {reason}",
                             hint="the cached wheels do not install on this machine; check the error above, or "
                                  "delete the wheel index of this lockfile from the store so the next build is cold",
                             output=tail)
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    _pip(py, ["install", "--no-index", "--no-deps", "--only-binary", ":all:", "--find-links", str(wheel_dir),
              "-r", str(reqs)], say, env, "installing the cached wheels",
         "the cached wheels of {pkg} do not install on this machine; check the error above, or delete the wheel "
         "index of this lockfile from the store so the next build is cold")


def _install_local(py: Path, files: list[Path], say: Progress) -> None:
    """The wheels built on the user's side, offline, after the lockfile's (their dependencies are in it)."""
    uv = _uv()
    names = ", ".join(p.name for p in files)
    say(f"installing {names}, built on your side")
    if uv:
        cmd = [uv, "pip", "install", "--quiet", "--offline", "--no-index", "--no-deps", "--python", str(py),
               *map(str, files)]
        rc, tail = _run(cmd, say, _uv_env(py.parent.parent))
    else:
        rc, tail = _run([str(py), "-m", "pip", "install", "--no-index", "--no-deps", *map(str, files)], say,
                        {**os.environ, "PIP_CONFIG_FILE": os.devnull})
    if rc != 0:
        reason = next((ln for ln in reversed(tail) if ln.strip()), "no output")
        raise UsageError(f"the wheels built on your side did not install ({names}): {reason}",
                         hint="check that the package builds a wheel for Linux (pip wheel --no-deps PATH)",
                         output=tail)


def _pip(py: Path, args: list[str], say: Progress, env: dict[str, str], doing: str, hint: str) -> None:
    say("$ pip " + redact(" ".join(args)))
    rc, tail = _run([str(py), "-m", "pip", *args], say, env)
    if rc == 0:
        return
    package = next((m[1].rstrip(",.;:'\"") for pattern in _PIP_PACKAGE for line in tail
                    if (m := pattern.search(line))), None)
    errors = [ln.removeprefix("ERROR: ") for ln in tail if ln.startswith("ERROR:")]
    reason = errors[-1] if errors else next((ln for ln in reversed(tail) if ln.strip()), "no output")
    where = f" for {package}" if package else ""
    raise UsageError(f"pip failed {doing}{where} (exit {rc}): {reason}",
                     hint=hint.format(pkg=package or "every package"), package=package, output=tail)


def _run(cmd: list[str], say: Progress, env: dict[str, str]) -> tuple[int, list[str]]:
    """Run ``cmd``, each output line (redacted) to ``say``; its exit status and last lines."""
    tail: deque[str] = deque(maxlen=_TAIL)
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", env=env)
    except OSError as exc:
        raise UsageError(f"cannot run {cmd[0]}: {exc.strerror or exc}",
                         hint="pass the path of a working Python 3 interpreter") from exc
    assert proc.stdout is not None
    try:
        for raw in proc.stdout:
            line = redact(raw.rstrip())
            tail.append(line)
            if line:
                say(line)
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
    return rc, list(tail)


__all__ = [
    "INDEX_FORMAT",
    "EnvBuild",
    "read_index_bytes",
    "Wheel",
    "WheelIndex",
    "build_env",
    "env_tag",
    "index_key",
    "read_index",
    "redact",
    "time_cold_and_warm",
]
