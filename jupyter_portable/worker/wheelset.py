"""The worker's wheel set: what the bootstrap installs on a machine, and why this computer trusts it.

The worker needs this package and a dozen libraries that a rented image does not have. They
travel as wheels, content-addressed in the store, and are installed on the machine by ``uv``
into a private venv keyed by the wheels' hash. The machine never needs a package index.

**Once, on the user's side** (cold): ``uv pip compile`` resolves the worker's requirements,
pinned to the versions installed here, for the machine's interpreter and platform; ``pip
download`` fetches exactly those wheels (from ``$JUPYTER_PORTABLE_WHEEL_FIND_LINKS`` folders
and/or the package index, ``$JUPYTER_PORTABLE_INDEX_URL``, unless ``$JUPYTER_PORTABLE_NO_INDEX``);
every wheel becomes a store object and a *worker wheel set* names them. This package's own
wheel is made from the files that run here, so the machine runs the user's exact code, an
editable install included. **Every later machine** of the same kind is warm: the set is read
from the store and no index is asked.

A set is trusted only when this computer stored it or fetched the same wheels itself
(``worker/trust`` holds its digest where no worker writes). The machine's side of the bootstrap
is :mod:`.bootstrap`.

Store layout (see ``docs/store-format.md``)::

    objects/<h[:2]>/<h>                      one wheel file (BLAKE3 of its bytes)
    wheels/worker/<r>/<env>.json             the worker wheel set of requirements <r> for <env>
    wheels/worker/<r>/<env>.venv.json        its venv archive (an object), see worker/venvpack.py

``<r>`` is the BLAKE3 of the pinned requirement lines, ``<env>`` the machine's
``cpython-311-linux-x86_64``-style tag. A set is ``{"format": "jupyter-portable.workerwheels",
"schema": 1, "requirements": [...], "env": ..., "wheels": [{"filename", "size", "hash",
"sha256"}]}``; this package's own wheel is never in it (it changes with every edit) and
travels beside it as one more object.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_portable.core.envplan import EnvChange, changes
from jupyter_portable.core.errors import IntegrityError, LaunchFailed, ManifestError, PortableError, UsageError
from jupyter_portable.core.validate import dumps_strict, loads_strict
from jupyter_portable.store.repo import Store, digest
from jupyter_portable.worker import trust
from jupyter_portable.worker.interpreter import Target
from jupyter_portable.worker.resolve import (
    download,
    normalise,
    resolve,
    source_args,
    why_not,
)

Progress = Callable[[str], None]
FIND_LINKS_ENV = "JUPYTER_PORTABLE_WHEEL_FIND_LINKS"  # os.pathsep-separated folders of wheels
INDEX_URL_ENV = "JUPYTER_PORTABLE_INDEX_URL"
NO_INDEX_ENV = "JUPYTER_PORTABLE_NO_INDEX"
FORMAT = "jupyter-portable.workerwheels"
REQUIRES_PYTHON = ">=3.10,<3.14"  # as pyproject.toml says; resolve.SUPPORTED is the same range
SCHEMA = 2  # 2: env names the micro version, and the set says what differs from the user's versions
_SET_FIELDS = frozenset({"format", "schema", "requirements", "env", "wheels", "changes"})

# what the worker imports on the machine (its HTTP API, the kernel, the store); the S3 client
# (a third of the bytes and most of the files) only for an s3:// store
WORKER_REQUIREMENTS = ("blake3", "pathspec", "tornado", "jupyter_core", "jupyter_client", "traitlets", "ipykernel",
                       "ipython", "ipywidgets", "fsspec", "httpx", "tenacity", "uv",
                       "pip",  # pip fetches a lockfile environment's wheels the first time (worker/envcache)
                       "inotify_simple",  # the kernel's change journal (engine/journal), pure Python
                       "jsonschema")  # the worker's API checks each body against its schema (core/bodies)
STORE_REQUIREMENTS = {"s3": ("s3fs", "boto3"), "gs": ("gcsfs",), "gcs": ("gcsfs",), "az": ("adlfs",),
                      "abfs": ("adlfs",), "abfss": ("adlfs",), "hf": ("huggingface_hub",)}
_WHEEL_NAME = re.compile(r"\A[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(-[A-Za-z0-9_.]+){2,3}\.whl\Z")
_HEX64 = re.compile(r"\A[0-9a-f]{64}\Z")
_ENV_TAG = re.compile(r"\A[a-z0-9_.]+-[0-9]+\.[0-9]+(\.[0-9]+)?[a-z]*-[a-z0-9_-]+\Z")


def _say(progress: Progress | None, line: str) -> None:
    if progress is not None:
        progress(line)



def requirements(store_url: str = "") -> list[str]:
    """The worker's requirements for a store at ``store_url``, pinned to the versions that run here."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    scheme = store_url.split("://", 1)[0] if "://" in store_url else "file"
    for name in (*WORKER_REQUIREMENTS, *STORE_REQUIREMENTS.get(scheme, ())):
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            raise UsageError(f"{name} is not installed here, so the worker's wheels cannot be pinned to it",
                             hint="reinstall jupyter-portable (pip install jupyter-portable)") from None
    return out


@dataclass(frozen=True)
class Wheel:
    filename: str
    size: int
    hash: str  # BLAKE3: the store object
    sha256: str  # what the machine checks (it has hashlib, not blake3)

    def to_json(self) -> dict[str, Any]:
        return {"filename": self.filename, "size": self.size, "hash": self.hash, "sha256": self.sha256}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "Wheel":
        if not isinstance(obj, dict) or set(obj) != {"filename", "size", "hash", "sha256"}:
            raise ManifestError(f"{where}: a wheel entry needs exactly filename, size, hash and sha256")
        w = cls(obj["filename"], obj["size"], obj["hash"], obj["sha256"])
        if not (isinstance(w.filename, str) and _WHEEL_NAME.match(w.filename)) or not isinstance(w.size, int) \
                or isinstance(w.size, bool) or w.size < 0 or not (isinstance(w.hash, str) and _HEX64.match(w.hash)) \
                or not (isinstance(w.sha256, str) and _HEX64.match(w.sha256)):
            raise ManifestError(f"{where}: malformed wheel entry {obj!r:.200}")
        return w


@dataclass(frozen=True)
class WheelSet:
    requirements: tuple[str, ...]
    env: str
    wheels: tuple[Wheel, ...]
    own: Wheel  # this package's wheel, made from the running files
    warm: bool
    changes: tuple[EnvChange, ...] = ()  # where the machine's versions differ from the user's, and why
    doc: bytes = b""  # the set's exact bytes in the store, as this computer trusts them

    @property
    def key(self) -> str:
        return set_key(self.requirements, self.env)

    @property
    def hash(self) -> str:
        """Names the venv on the machine: every wheel that goes into it."""
        return hashlib.sha256("\n".join(sorted(w.sha256 for w in (*self.wheels, self.own))).encode()).hexdigest()

    def uv(self) -> Wheel:
        for w in self.wheels:
            if w.filename.startswith("uv-"):
                return w
        raise ManifestError(f"{self.key}: the wheel set has no uv wheel")


def set_key(reqs: Iterable[str], env: str) -> str:
    if not _ENV_TAG.match(env):
        raise UsageError(f"not an interpreter tag: {env!r}")
    return f"wheels/worker/{digest(chr(10).join(reqs).encode())}/{env}.json"


def _read_set(store: Store, reqs: list[str], env: str) -> tuple[list[Wheel], list[EnvChange], bytes] | None:
    key = set_key(reqs, env)
    if not store.backend.exists(key):
        return None
    data = store.backend.read(key)
    obj = loads_strict(data, what=key)
    if not isinstance(obj, dict) or set(obj) != _SET_FIELDS or obj.get("format") != FORMAT \
            or obj.get("schema") != SCHEMA or obj.get("requirements") != reqs or obj.get("env") != env \
            or not isinstance(obj.get("wheels"), list) or not isinstance(obj.get("changes"), list):
        raise ManifestError(f"{key} is not a worker wheel set for these requirements",
                            hint=f"delete {key} from the store; the next bootstrap fetches the wheels again")
    return [Wheel.from_json(w, key) for w in obj["wheels"]], [EnvChange.from_json(c, key) for c in obj["changes"]], data


def put_wheel(store: Store, data: bytes, filename: str) -> Wheel:
    h = store.put_object(data) if not store.has_object(h := digest(data)) else h
    return Wheel(filename, len(data), h, hashlib.sha256(data).hexdigest())


def own_wheel() -> tuple[str, bytes]:
    """This package as a wheel, made from the files that run here (PEP 427 layout)."""
    from importlib.metadata import version as installed

    root = Path(__file__).resolve().parents[1]
    version = installed("jupyter-portable")
    dist = f"jupyter_portable-{version}.dist-info"
    files: list[tuple[str, bytes]] = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root.parent).as_posix()
        if path.is_dir() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo") \
                or rel.startswith("jupyter_portable/labextension/"):
            continue  # the browser half is the user's side only
        files.append((rel, path.read_bytes()))
    files.append((f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: jupyter-portable\nVersion: {version}\n"
                                           f"Requires-Python: {REQUIRES_PYTHON}\n".encode()))
    files.append((f"{dist}/WHEEL", b"Wheel-Version: 1.0\nGenerator: jupyter-portable bootstrap\n"
                                   b"Root-Is-Purelib: true\nTag: py3-none-any\n"))
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip('=')},"
                     f"{len(data)}\n" for name, data in files) + f"{dist}/RECORD,,\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in [*files, (f"{dist}/RECORD", record.encode())]:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # the same files make the same wheel
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return f"jupyter_portable-{version}-py3-none-any.whl", buf.getvalue()


def index_sources(find_links: list[str] | None, index_url: str | None, no_index: bool | None) -> list[str]:
    """Where the user's side fetches wheels: the arguments given, else ``c.PortableWheels`` (find_links,
    index_url, no_index; JUPYTER_PORTABLE_WHEEL_FIND_LINKS, _INDEX_URL, _NO_INDEX), as uv's and pip's
    command-line options."""
    from jupyter_portable.core.envconfig import PortableWheels

    wheels = PortableWheels.current()
    links = find_links if find_links is not None else list(wheels.find_links)
    index = index_url or wheels.index_url or None
    offline = no_index if no_index is not None else wheels.no_index
    return source_args(links, index, offline)


def installed_here() -> dict[str, str]:
    """Every distribution installed with this interpreter: the versions a resolve prefers."""
    from importlib.metadata import distributions

    out: dict[str, str] = {}
    for dist in distributions():
        name = dist.metadata["Name"]
        if name and dist.version:
            out.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
    return out


def fetch_wheels(reqs: list[str], target: Target, dest: Path, *, find_links: list[str] | None = None,
                 index_url: str | None = None, no_index: bool | None = None,
                 progress: Progress | None = None) -> tuple[list[Path], list[EnvChange]]:
    """Resolve ``reqs`` for ``target`` (the versions installed here preferred, the nearest compatible
    ones where they do not fit), download exactly those wheels, and say what differs and why."""
    sources = index_sources(find_links, index_url, no_index)
    platform = target.wheel_platform()
    _say(progress, f"resolving {len(reqs)} requirements for {target.tag} with uv")
    prefs = installed_here()
    prefs.update({normalise(r.split("==", 1)[0]): r.split("==", 1)[1] for r in reqs if "==" in r})
    names = [r.split("==", 1)[0] for r in reqs]
    resolved = resolve(names, prefs, platform, sources, what="the worker's wheels",
                       hint=f"set {FIND_LINKS_ENV} to a folder of wheels, or allow the package index "
                            f"({INDEX_URL_ENV}), then Continue again")
    recorded = {n: prefs[n] for n in resolved if n in prefs}
    reasons = {n: why_not(n, v, platform, sources) for n, v in recorded.items() if resolved[n] != v}
    diffs = changes(recorded, resolved, reasons)
    for change in diffs:
        _say(progress, f"for {target.tag}: {change.line()}")
    _say(progress, f"downloading {len(resolved)} wheels")
    files = download(resolved, platform, dest, sources, what="the worker's wheels", python=sys.executable)
    return files, diffs


def wheel_set(store: Store, target: Target, *, find_links: list[str] | None = None, index_url: str | None = None,
              no_index: bool | None = None, progress: Progress | None = None) -> WheelSet:
    """The worker's wheels for ``target``, from the store (warm) or fetched once and stored (cold)."""
    reqs = requirements(store.url)
    name, data = own_wheel()
    own = put_wheel(store, data, name)
    key = set_key(reqs, target.tag)
    found = _read_set(store, reqs, target.tag)
    if found is not None and trust.check(store.url, key, found[2]):
        # warm: the set is the one this computer stored (its digest is held here, where no worker writes)
        return WheelSet(tuple(reqs), target.tag, tuple(found[0]), own, warm=True, changes=tuple(found[1]),
                        doc=found[2])
    if found is not None:
        _say(progress, f"{key} was not stored from this computer: fetching its wheels here to check them")
    with tempfile.TemporaryDirectory(prefix="jp-wheels-") as tmp:
        files, diffs = fetch_wheels(reqs, target, Path(tmp), find_links=find_links, index_url=index_url,
                                    no_index=no_index, progress=progress)
        if found is not None:
            _confirm(key, found[0], files)
            trust.record(store.url, key, found[2])
            return WheelSet(tuple(reqs), target.tag, tuple(found[0]), own, warm=False, changes=tuple(found[1]),
                            doc=found[2])
        wheels = tuple(put_wheel(store, f.read_bytes(), f.name) for f in files)
    if not any(w.filename.startswith("uv-") for w in wheels):
        raise LaunchFailed("the worker's wheels lack uv for the machine", provider="")
    doc = {"format": FORMAT, "schema": SCHEMA, "requirements": reqs, "env": target.tag,
           "wheels": [w.to_json() for w in sorted(wheels, key=lambda w: w.filename)],
           "changes": [c.to_json() for c in diffs]}
    data = dumps_strict(doc, key).encode()
    try:
        store.backend.write_new(key, data)
    except PortableError:  # a bootstrap racing this one wrote its set first: keep theirs if it is the same
        theirs = _read_set(store, reqs, target.tag)
        if theirs is None:
            raise
        _confirm(key, theirs[0], [], sha256={w.filename: w.sha256 for w in wheels})
        data = theirs[2]
    trust.record(store.url, key, data)
    _say(progress, f"stored {len(wheels)} wheels for {target.tag}; later machines of this kind are warm")
    return WheelSet(tuple(reqs), target.tag, wheels, own, warm=False, changes=tuple(diffs), doc=data)


def _confirm(key: str, wheels: Iterable[Wheel], files: Iterable[Path], *, sha256: dict[str, str] | None = None) -> None:
    """The set ``key`` names exactly the wheels this side fetched itself (``files``, or their ``sha256``)."""
    mine = sha256 if sha256 is not None else {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    theirs = {w.filename: w.sha256 for w in wheels}
    if mine != theirs:
        odd = sorted(n for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n))
        raise IntegrityError(f"{key} in the store names wheels this computer cannot confirm "
                             f"({', '.join(odd[:5])}): they differ from the ones fetched here",
                             hint=f"delete {key} from the store; the next Continue stores the wheels fetched here")



__all__ = ["FIND_LINKS_ENV", "FORMAT", "INDEX_URL_ENV", "NO_INDEX_ENV", "REQUIRES_PYTHON", "SCHEMA",
           "Wheel", "WheelSet", "fetch_wheels", "index_sources", "installed_here", "own_wheel",
           "put_wheel", "requirements", "set_key", "wheel_set"]
