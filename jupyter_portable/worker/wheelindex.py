"""The wheel index: which stored wheels build one lockfile's environment on one kind of interpreter.

The worker's environment build (:mod:`.envcache`) reads it; the user's side prepares and records it
(:mod:`.envprep`).

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
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jupyter_portable.core.envplan import EnvChange
from jupyter_portable.core.errors import IntegrityError, ManifestError, ObjectMissing, UsageError
from jupyter_portable.core.manifest import check_hash
from jupyter_portable.engine.runtime.lockfile import normalise
from jupyter_portable.store.repo import Store, digest

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
WHEEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.]*(?:-[A-Za-z0-9_.+!]+){4,5}\.whl")
_ENV = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
_REQUIREMENT = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?==[A-Za-z0-9][A-Za-z0-9.+!_-]{0,99}")
_ENV_PROBE = (
    "import sys, sysconfig; v = sys.version_info; "
    "print('%s-%d.%d.%d%s-%s' % (sys.implementation.name, v[0], v[1], v[2], getattr(sys, 'abiflags', ''), "
    "sysconfig.get_platform()))"
)


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
    if not isinstance(name, str) or not WHEEL_NAME.fullmatch(name):
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


__all__ = ["ARCHIVE_NAME", "INDEX_FORMAT", "INDEX_SCHEMA", "WHEEL_NAME", "Wheel", "WheelIndex",
           "check_covers", "env_tag", "index_key", "read_index", "read_index_bytes"]
