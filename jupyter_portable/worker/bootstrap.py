"""Zero-install bootstrap: a bare machine with ``python3`` >= 3.10 and SSH runs the worker.

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

**On the machine**, over the SSH connection (so it works for any store, and the machine
needs no store credentials for it), in two round trips: one probe says what the machine's
Python is and what an earlier bootstrap left there; then the files the machine lacks are
streamed as one tar, each checked against its SHA-256 before anything runs. ``uv`` (itself one
of the wheels) makes ``<workdir>/venvs/<set hash>`` with ``--system-site-packages`` (the image's
own libraries, such as its torch, stay importable for the kernel), and the set goes into it:
by default as **one venv archive** laid out on the user's side once per set and interpreter
(:mod:`.venvpack`) and unpacked in one pass, with this package's own wheel unpacked beside it;
where no archive can be made (or ``$JUPYTER_PORTABLE_BOOTSTRAP_ARCHIVE=0``), by ``uv pip install
--no-deps --offline`` of each wheel. The venv is marked complete last, so a cut-off bootstrap is
redone. :class:`BootstrapResult` says which way it went and where the seconds went (``phases``).

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
import inspect
import io
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_portable.core.envplan import EnvChange, changes
from jupyter_portable.core.errors import IntegrityError, LaunchFailed, ManifestError, PortableError, UsageError
from jupyter_portable.core.validate import dumps_strict, loads_strict
from jupyter_portable.store.repo import Store, digest
from jupyter_portable.worker import trust, venvpack
from jupyter_portable.worker.resolve import (
    Platform,
    download,
    normalise,
    pick_hint,
    resolve,
    source_args,
    supported,
    why_not,
)

Progress = Callable[[str], None]
FIND_LINKS_ENV = "JUPYTER_PORTABLE_WHEEL_FIND_LINKS"  # os.pathsep-separated folders of wheels
INDEX_URL_ENV = "JUPYTER_PORTABLE_INDEX_URL"
NO_INDEX_ENV = "JUPYTER_PORTABLE_NO_INDEX"
ARCHIVE_ENV = "JUPYTER_PORTABLE_BOOTSTRAP_ARCHIVE"  # "0": uv installs each wheel on the machine (the old way)
FORMAT = "jupyter-portable.workerwheels"
REQUIRES_PYTHON = ">=3.10,<3.14"  # as pyproject.toml says; resolve.SUPPORTED is the same range
SCHEMA = 2  # 2: env names the micro version, and the set says what differs from the user's versions
_SET_FIELDS = frozenset({"format", "schema", "requirements", "env", "wheels", "changes"})

# what the worker imports on the machine (its HTTP API, the kernel, the store); the S3 client
# (a third of the bytes and most of the files) only for an s3:// store
WORKER_REQUIREMENTS = ("blake3", "pathspec", "tornado", "jupyter_core", "jupyter_client", "traitlets", "ipykernel",
                       "ipython", "ipywidgets", "fsspec", "httpx", "tenacity", "uv",
                       "pip",  # pip fetches a lockfile environment's wheels the first time (worker/envcache)
                       "inotify_simple")  # the kernel's change journal (engine/journal), pure Python
STORE_REQUIREMENTS = {"s3": ("s3fs", "boto3"), "gs": ("gcsfs",), "gcs": ("gcsfs",), "az": ("adlfs",),
                      "abfs": ("adlfs",), "abfss": ("adlfs",), "hf": ("huggingface_hub",)}
_WHEEL_NAME = re.compile(r"\A[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(-[A-Za-z0-9_.]+){2,3}\.whl\Z")
_HEX64 = re.compile(r"\A[0-9a-f]{64}\Z")
_ENV_TAG = re.compile(r"\A[a-z0-9_.]+-[0-9]+\.[0-9]+(\.[0-9]+)?[a-z]*-[a-z0-9_-]+\Z")


def _say(progress: Progress | None, line: str) -> None:
    if progress is not None:
        progress(line)


# -- what the machine is ---------------------------------------------------------------------------

# runs on the machine's own python3, whatever its version: stdlib only, syntax Python 3.6 still parses
_PROBE = r'''
import json, platform, sys, sysconfig
libc = platform.libc_ver()
packages = {}
try:
    from importlib import metadata
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and dist.version:
            packages[name.lower().replace("_", "-").replace(".", "-")] = dist.version
except Exception:
    pass
print(json.dumps({"python": sys.executable, "version": "%d.%d" % sys.version_info[:2],
                  "full_version": platform.python_version(),
                  "implementation": sys.implementation.name, "abiflags": getattr(sys, "abiflags", ""),
                  "platform": sysconfig.get_platform(), "machine": platform.machine(),
                  "libc": libc[0], "libc_version": libc[1], "packages": packages}))
'''

# the probe, and what an earlier bootstrap left in the workdir (argv[2]: {"workdir": ...}): one round trip
_PROBE_LIST = _PROBE.replace("print(json.dumps({", "out = dict(({", 1) + r'''
import os
root = os.path.expanduser(json.loads(sys.argv[2])["workdir"])
have, ready = {}, []
for name in (os.listdir(os.path.join(root, "wheels")) if os.path.isdir(os.path.join(root, "wheels")) else []):
    if name.endswith(".sha256"):
        with open(os.path.join(root, "wheels", name)) as fh:
            have[name[:-7]] = fh.read().strip()
for name in (os.listdir(os.path.join(root, "venvs")) if os.path.isdir(os.path.join(root, "venvs")) else []):
    if os.path.exists(os.path.join(root, "venvs", name, ".complete")):
        ready.append(name)
out.update(have=have, ready=ready, home=root)
print(json.dumps(out))
'''


@dataclass(frozen=True)
class Target:
    """The machine's interpreter, as wheels must fit it."""

    python: str
    version: str  # "3.11"
    implementation: str
    abiflags: str
    platform: str  # sysconfig's, e.g. linux-x86_64
    machine: str
    libc_version: str
    full_version: str = ""  # "3.11.2": requires-python tells 3.11.2 from 3.11.7
    packages: tuple[tuple[str, str], ...] = ()  # what the machine's Python already has (the image's torch...)

    @property
    def tag(self) -> str:
        """``cpython-3.11.2-linux-x86_64``: what a wheel set must fit, down to the micro version."""
        return f"{self.implementation}-{self.full_version or self.version}{self.abiflags}-{self.platform}".lower()

    def wheel_platform(self) -> Platform:
        return Platform(self.full_version or self.version, self.uv_platform(), tuple(self.pip_platforms()))

    @classmethod
    def from_json(cls, obj: Any) -> "Target":
        try:
            raw = obj.get("packages") or {}
            packages = tuple(sorted((str(k)[:200], str(v)[:100]) for k, v in raw.items()))[:5000] \
                if isinstance(raw, dict) else ()
            full = str(obj.get("full_version") or "")
            t = cls(python=str(obj["python"]), version=str(obj["version"]), implementation=str(obj["implementation"]),
                    abiflags=str(obj["abiflags"]), platform=str(obj["platform"]).replace(".", "_"),
                    machine=str(obj["machine"]), libc_version=str(obj.get("libc_version") or ""),
                    full_version=full if re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", full) else "", packages=packages)
        except (KeyError, TypeError, AttributeError) as exc:
            raise LaunchFailed(f"the machine's Python did not describe itself ({exc})", provider="") from None
        ok, why = supported(t.version)
        if not ok:
            raise LaunchFailed(f"{why}; nothing was installed on it", provider="", hint=pick_hint())
        if t.implementation != "cpython" or not t.platform.startswith("linux-"):
            raise LaunchFailed(f"the machine runs {t.implementation} on {t.platform}; the worker's wheels are "
                               "fetched for CPython on Linux", provider="")
        return t

    def pip_platforms(self) -> list[str]:
        """The wheel platform tags this machine takes, newest first (manylinux down to 2_17)."""
        arch = self.machine
        major, _, minor = self.libc_version.partition(".")
        top = int(minor) if major == "2" and minor.isdigit() else 17
        return [*(f"manylinux_2_{m}_{arch}" for m in range(top, 16, -1)), f"manylinux2014_{arch}", f"linux_{arch}"]

    def uv_platform(self) -> str:
        major, _, minor = self.libc_version.partition(".")
        return f"{self.machine}-manylinux_2_{minor if major == '2' and minor.isdigit() else 17}"


def probe_python(run_python: Callable[[str], str]) -> Target:
    """Ask the machine's ``python3`` what it is (``run_python(script) -> stdout``)."""
    out = run_python(_PROBE)
    try:
        return Target.from_json(json.loads(out.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        raise LaunchFailed(f"the machine's python3 did not answer: {out.strip()[:200]!r}", provider="",
                           hint="the machine needs python3 >= 3.10 on its PATH") from None


# -- the wheel set -----------------------------------------------------------------------------

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


def _put_wheel(store: Store, data: bytes, filename: str) -> Wheel:
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
    own = _put_wheel(store, data, name)
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
        wheels = tuple(_put_wheel(store, f.read_bytes(), f.name) for f in files)
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


# -- on the machine ----------------------------------------------------------------------------

_INSTALL = r'''from __future__ import annotations
import hashlib, json, os, shutil, stat, subprocess, sys, tarfile, time, zipfile
P = json.loads(sys.argv[2])  # argv[1] is this script itself, in base64
phases, lap = {}, [time.monotonic()]
def done(phase):
    now = time.monotonic()
    phases[phase] = round(now - lap[0], 3)
    lap[0] = now
# the unpackers
root = os.path.expanduser(P["workdir"])
wheels = os.path.join(root, "wheels")
os.makedirs(wheels, exist_ok=True)
want = P["wheels"]  # filename -> sha256
arrived = {}  # what came now, checked as it came: not hashed again from the disk; the archive's bytes kept
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as tar:
    for member in tar:
        name = member.name
        if not member.isfile() or name not in want or "/" in name:
            sys.exit("refusing tar member %r" % name)
        data = tar.extractfile(member).read()
        if hashlib.sha256(data).hexdigest() != want[name]:
            sys.exit("wheel %s arrived corrupted" % name)
        tmp = os.path.join(wheels, name + ".part")
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, os.path.join(wheels, name))
        with open(os.path.join(wheels, name + ".sha256"), "w") as fh:
            fh.write(want[name])
        arrived[name] = data if name == P.get("archive") else None
def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
# every wheel, the ones kept from an earlier bootstrap too, against the hashes the user's side sent:
# nothing runs that the user's side did not name
for name, sha in want.items():
    path = os.path.join(wheels, name)
    if name in arrived:
        continue
    if not os.path.exists(path):
        sys.exit("wheel %s is missing on the machine" % name)
    if sha256_of(path) != sha:
        sys.exit("wheel %s on the machine does not match the SHA-256 your side holds" % name)
done("receive_check_s")
uvdir = os.path.join(root, "uv", P["uv"][:16])
uvbin = os.path.join(uvdir, "uv")
os.makedirs(uvdir, exist_ok=True)
with zipfile.ZipFile(os.path.join(wheels, P["uv_wheel"])) as zf:
    inner = [n for n in zf.namelist() if n.endswith("/scripts/uv")]
    if not inner:
        sys.exit("the uv wheel has no uv binary")
    member = hashlib.sha256()
    with zf.open(inner[0]) as src, open(uvbin + ".part", "wb") as dst:  # one pass: hashed as it is written
        for chunk in iter(lambda: src.read(1 << 20), b""):
            member.update(chunk)
            dst.write(chunk)
    if os.path.exists(uvbin) and sha256_of(uvbin) == member.hexdigest():  # the binary is the checked wheel's
        os.remove(uvbin + ".part")
    else:
        os.chmod(uvbin + ".part", 0o755)
        os.replace(uvbin + ".part", uvbin)
venv = os.path.join(root, "venvs", P["set"])
env = dict(os.environ, UV_CACHE_DIR=os.path.join(root, "uv-cache"), UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never")
shutil.rmtree(venv, ignore_errors=True)
done("uv_s")
def run(args):
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit("%s failed: %s" % (args[1], (proc.stderr.strip().splitlines() or ["?"])[-1]))
run([uvbin, "venv", "--quiet", "--system-site-packages", "--python", sys.executable, venv])
done("venv_s")
if P.get("archive"):
    # the venv laid out on the user's side, one archive: unpacked in one pass from the bytes that were
    # hashed (as they arrived, or read again); then this package's own wheel (pure Python, no scripts)
    blob = arrived.get(P["archive"])
    if blob is None:  # kept from an earlier bootstrap: read once, and what is unpacked is what is hashed
        with open(os.path.join(wheels, P["archive"]), "rb") as fh:
            blob = fh.read()
        if hashlib.sha256(blob).hexdigest() != want[P["archive"]]:
            sys.exit("the venv archive changed on the machine")
    try:
        unpack(tar_entries(blob), venv)
        done("unpack_s")
        unpack(zip_entries(os.path.join(wheels, P["own"])), os.path.join(
            venv, "lib", "python%d.%d" % sys.version_info[:2], "site-packages"))
    except (ValueError, OSError) as exc:
        sys.exit("unpacking the worker's venv failed: %s" % exc)
    done("own_s")
else:
    # no cache: the venv is made once per wheel set, and unpacking straight into it is half the work;
    # uv's own wheel is not installed again (its binary is a third of the bytes): the venv links it
    run([uvbin, "pip", "install", "--quiet", "--offline", "--no-index", "--no-deps", "--no-cache", "--python",
         os.path.join(venv, "bin", "python")] + [os.path.join(wheels, n) for n in sorted(want) if n != P["uv_wheel"]])
    done("install_s")
os.symlink(uvbin, os.path.join(venv, "bin", "uv"))
with open(os.path.join(venv, ".complete"), "w") as fh:
    fh.write(P["set"])
print(json.dumps({"python": os.path.join(venv, "bin", "python"), "phases": phases}))
'''


_INSTALL = _INSTALL.replace("# the unpackers\n", "\n".join(
    inspect.getsource(f) for f in (venvpack.unpack, venvpack.tar_entries, venvpack.zip_entries)), 1)


def remote_command(python: str, script: str, payload: dict[str, Any]) -> str:
    """A shell command line running ``script`` with ``payload`` under ``python``: both travel as
    base64 and JSON, so nothing in them is ever read by the shell, and stdin stays free for data."""
    code = base64.b64encode(script.encode()).decode()
    return (f"{python} -c 'import base64,sys; exec(base64.b64decode(sys.argv[1]))' {code} "
            + shlex.quote(json.dumps(payload, separators=(",", ":"))))


def _tar(store: Store, wheels: Iterable[Wheel]) -> bytes:
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for w in wheels:
            data = store.get_object(w.hash, what=f"wheel {w.filename}")
            if hashlib.sha256(data).hexdigest() != w.sha256:
                raise IntegrityError(f"wheel {w.filename} in the store does not match its recorded SHA-256")
            info = tarfile.TarInfo(w.filename)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class BootstrapResult:
    python: str
    warm_store: bool  # the wheels came from the store (no package index asked)
    sent: int  # files sent to the machine (wheels, the venv archive)
    reused_venv: bool
    seconds: float
    target: Target | None = None  # the machine's interpreter, as the probe found it
    changes: tuple[EnvChange, ...] = ()  # the worker's versions that differ from the user's
    installed_from: str = ""  # "archive" (one venv archive unpacked) or "wheels" (uv installed each); "" reused
    phases: dict[str, float] | None = None  # where the seconds went, on this side and on the machine

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"python": self.python, "warm": self.warm_store, "sent": self.sent,
                               "reused_venv": self.reused_venv, "seconds": round(self.seconds, 3),
                               "changes": [c.to_json() for c in self.changes], "installed_from": self.installed_from,
                               "phases": dict(self.phases or {})}
        if self.target is not None:
            out["interpreter"] = {"version": self.target.full_version or self.target.version, "tag": self.target.tag,
                                  "machine": self.target.machine, "libc": self.target.libc_version}
        return out


def bootstrap(exec_remote: Callable[[str, bytes | None, float], tuple[int, bytes, bytes]], store: Store, *,
              workdir: str = "~/.jupyter-portable", python: str = "python3", progress: Progress | None = None,
              clock: Callable[[], float] = time.monotonic, timeout_s: float = 600,
              archive: bool | None = None) -> BootstrapResult:
    """Install the worker on a machine reached by ``exec_remote(command, stdin, timeout) -> (rc, out, err)``;
    returns the Python that runs it there. ``archive``: unpack the venv laid out on this side
    (:mod:`.venvpack`) where it can be made; otherwise, or when it cannot, uv installs each wheel
    (None: ``c.PortableWheels.archive``, False when ``$JUPYTER_PORTABLE_BOOTSTRAP_ARCHIVE`` is ``0``)."""
    started = clock()
    if archive is None:
        from jupyter_portable.core.envconfig import PortableWheels

        archive = PortableWheels.current().archive
    phases: dict[str, float] = {}
    lap = [started]

    def done(phase: str) -> None:
        now = clock()
        phases[phase] = round(now - lap[0], 3)
        lap[0] = now

    if not workdir.startswith("~/") and not workdir.startswith("/"):
        raise UsageError(f"the remote workdir must be absolute or under ~/: {workdir!r}")

    def run(script: str, payload: dict[str, Any], data: bytes | None = None) -> dict[str, Any]:
        rc, out, err = exec_remote(remote_command(python, script, payload), data, timeout_s)
        lines = out.decode(errors="replace").strip().splitlines()
        if rc != 0 or not lines:
            raise LaunchFailed(f"installing the worker on the machine failed: "
                               f"{(err.decode(errors='replace').strip().splitlines() or ['no output'])[-1][:400]}",
                               provider="")
        answer = json.loads(lines[-1])
        if not isinstance(answer, dict):
            raise LaunchFailed("the machine's bootstrap gave no answer", provider="")
        return answer

    _say(progress, "asking the machine's python3 what it is, and what it has")
    rc, out, err = exec_remote(remote_command(python, _PROBE_LIST, {"workdir": workdir}), None, 60)
    if rc != 0:
        raise LaunchFailed(f"the machine has no usable python3: {err.decode(errors='replace').strip()[-300:]}",
                           provider="", hint="the machine needs python3 >= 3.10 on its PATH")
    target = probe_python(lambda _script: out.decode(errors="replace"))
    state = json.loads(out.decode(errors="replace").strip().splitlines()[-1])
    home = str(state.get("home") or workdir)
    done("probe_s")
    wset = wheel_set(store, target, progress=progress)
    done("wheel_set_s")
    if wset.hash in (state.get("ready") or []):
        _say(progress, "the worker is already installed on this machine")
        return BootstrapResult(f"{home}/venvs/{wset.hash}/bin/python", wset.warm, 0, True, clock() - started,
                               target, wset.changes, "", phases)
    packed: venvpack.Archive | None = None
    if archive:
        try:
            packed = venvpack.archive_for(
                store, wset.key, wset.doc, target.tag, target.full_version or target.version, target.uv_platform(),
                [(w.filename, w.hash, w.sha256) for w in wset.wheels if w is not wset.uv()], progress=progress)
        except IntegrityError:
            raise  # the store holds another archive than the one recorded here: nothing runs
        except PortableError as exc:
            _say(progress, f"no venv archive for {target.tag} ({exc}): installing the wheels one by one")
        done("archive_s")
    if packed is not None:
        box = Wheel(f"worker-venv-{packed.sha256[:16]}.tar.gz", packed.size, packed.hash, packed.sha256)
        everything: tuple[Wheel, ...] = (box, wset.own, wset.uv())
    else:
        everything = (*wset.wheels, wset.own)
    have: dict[str, Any] = state["have"] if isinstance(state.get("have"), dict) else {}
    missing = [w for w in everything if have.get(w.filename) != w.sha256]
    _say(progress, f"sending {len(missing)} of {len(everything)} "
                   f"{'files (the venv archive, this package, uv)' if packed else 'wheels'} to the machine"
                   f"{' (all from the store)' if wset.warm else ''}")
    payload = {"workdir": workdir, "set": wset.hash, "wheels": {w.filename: w.sha256 for w in everything},
               "uv": wset.uv().sha256, "uv_wheel": wset.uv().filename,
               "archive": everything[0].filename if packed else None, "own": wset.own.filename}
    data = _tar(store, missing)
    done("read_store_s")
    answer = run(_INSTALL, payload, data)
    done("machine_s")
    machine = answer.get("phases")
    if isinstance(machine, dict):
        phases.update({f"machine.{k}": float(v) for k, v in machine.items() if isinstance(v, (int, float))})
    _say(progress, f"the worker is installed ({'one archive unpacked' if packed else 'each wheel installed'}; "
                   + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()) + ")")
    return BootstrapResult(str(answer["python"]), wset.warm, len(missing), False, clock() - started, target,
                           wset.changes, "archive" if packed else "wheels", phases)


def local_target() -> Target:
    """This interpreter, described as a machine's would be."""
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout
    return probe_python(lambda _script: out)


def target_for(version: str, machine: str = "x86_64", libc_version: str = "2.36") -> Target:
    """A machine described without asking it: CPython ``version`` ("3.10.13") on glibc Linux."""
    parts = version.split(".")
    return Target.from_json({"python": "python3", "version": ".".join(parts[:2]), "full_version": version,
                             "implementation": "cpython", "abiflags": "", "platform": f"linux-{machine}",
                             "machine": machine, "libc_version": libc_version})


def main(argv: list[str] | None = None) -> int:
    """``python -m jupyter_portable.worker.bootstrap --wheelhouse DIR [--python 3.10.13 ...]``: download
    the worker's wheels for this interpreter (and each ``--python`` version) into DIR, a find-links
    folder for machines of those kinds (offline tests)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m jupyter_portable.worker.bootstrap")
    parser.add_argument("--wheelhouse", required=True, type=Path)
    parser.add_argument("--python", action="append", default=[], metavar="VERSION",
                        help="also for CPython VERSION (e.g. 3.10.13) on glibc Linux, this machine's architecture")
    args = parser.parse_args(argv)
    here = local_target()
    targets = [here, *(target_for(v, here.machine, here.libc_version or "2.36") for v in args.python)]
    total = 0
    for target in targets:
        files, _ = fetch_wheels(requirements("s3://"), target, args.wheelhouse, find_links=[], no_index=False,
                                progress=print)
        total = len(files)
    print(f"{total} wheels in {args.wheelhouse}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["FIND_LINKS_ENV", "INDEX_URL_ENV", "NO_INDEX_ENV", "BootstrapResult", "Target", "WheelSet", "bootstrap",
           "fetch_wheels", "installed_here", "own_wheel", "probe_python", "requirements", "target_for", "wheel_set"]
