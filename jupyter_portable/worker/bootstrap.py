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
needs no store credentials for it): the wheels the machine lacks are streamed as one tar,
each checked against its SHA-256; ``uv`` (itself one of the wheels) makes
``<workdir>/venvs/<set hash>`` with ``--system-site-packages`` (the image's own libraries,
such as its torch, stay importable for the kernel) and installs the set into it with
``--no-deps --offline``. The venv is marked complete last, so a cut-off bootstrap is redone.

Store layout (see ``docs/store-format.md``)::

    objects/<h[:2]>/<h>                      one wheel file (BLAKE3 of its bytes)
    wheels/worker/<r>/<env>.json             the worker wheel set of requirements <r> for <env>

``<r>`` is the BLAKE3 of the pinned requirement lines, ``<env>`` the machine's
``cpython-311-linux-x86_64``-style tag. A set is ``{"format": "jupyter-portable.workerwheels",
"schema": 1, "requirements": [...], "env": ..., "wheels": [{"filename", "size", "hash",
"sha256"}]}``; this package's own wheel is never in it (it changes with every edit) and
travels beside it as one more object.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
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

from jupyter_portable.core.errors import IntegrityError, LaunchFailed, ManifestError, PortableError, UsageError
from jupyter_portable.core.validate import dumps_strict, loads_strict
from jupyter_portable.store.repo import Store, digest

Progress = Callable[[str], None]
FIND_LINKS_ENV = "JUPYTER_PORTABLE_WHEEL_FIND_LINKS"  # os.pathsep-separated folders of wheels
INDEX_URL_ENV = "JUPYTER_PORTABLE_INDEX_URL"
NO_INDEX_ENV = "JUPYTER_PORTABLE_NO_INDEX"
FORMAT = "jupyter-portable.workerwheels"

# what the worker imports on the machine (its HTTP API, the kernel, the store); the S3 client
# (a third of the bytes and most of the files) only for an s3:// store
WORKER_REQUIREMENTS = ("blake3", "pathspec", "tornado", "jupyter_core", "jupyter_client", "traitlets", "ipykernel",
                       "ipython", "ipywidgets", "fsspec", "httpx", "tenacity", "uv",
                       "pip")  # pip fetches a lockfile environment's wheels the first time (worker/envcache)
STORE_REQUIREMENTS = {"s3": ("s3fs", "boto3"), "gs": ("gcsfs",), "gcs": ("gcsfs",), "az": ("adlfs",),
                      "abfs": ("adlfs",), "abfss": ("adlfs",), "hf": ("huggingface_hub",)}
_WHEEL_NAME = re.compile(r"\A[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(-[A-Za-z0-9_.]+){2,3}\.whl\Z")
_HEX64 = re.compile(r"\A[0-9a-f]{64}\Z")
_ENV_TAG = re.compile(r"\A[a-z0-9_.]+-[0-9]{2,3}[a-z]*-[a-z0-9_-]+\Z")


def _say(progress: Progress | None, line: str) -> None:
    if progress is not None:
        progress(line)


# -- what the machine is ---------------------------------------------------------------------------

_PROBE = r'''
import json, platform, sys, sysconfig
libc = platform.libc_ver()
print(json.dumps({"python": sys.executable, "version": "%d.%d" % sys.version_info[:2],
                  "implementation": sys.implementation.name, "abiflags": getattr(sys, "abiflags", ""),
                  "platform": sysconfig.get_platform(), "machine": platform.machine(),
                  "libc": libc[0], "libc_version": libc[1]}))
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

    @property
    def tag(self) -> str:
        impl = {"cpython": "cpython"}.get(self.implementation, self.implementation)
        return f"{impl}-{self.version.replace('.', '')}{self.abiflags}-{self.platform}".lower()

    @classmethod
    def from_json(cls, obj: Any) -> "Target":
        try:
            t = cls(python=str(obj["python"]), version=str(obj["version"]), implementation=str(obj["implementation"]),
                    abiflags=str(obj["abiflags"]), platform=str(obj["platform"]).replace(".", "_"),
                    machine=str(obj["machine"]), libc_version=str(obj.get("libc_version") or ""))
        except (KeyError, TypeError) as exc:
            raise LaunchFailed(f"the machine's Python did not describe itself ({exc})", provider="") from None
        major, _, minor = t.version.partition(".")
        if not (major.isdigit() and minor.isdigit()) or (int(major), int(minor)) < (3, 10):
            raise LaunchFailed(f"the machine's python3 is {t.version}; the worker needs Python 3.10 or newer",
                               provider="", hint="choose an image with Python >= 3.10")
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


def _read_set(store: Store, reqs: list[str], env: str) -> list[Wheel] | None:
    key = set_key(reqs, env)
    if not store.backend.exists(key):
        return None
    data = store.backend.read(key)
    obj = loads_strict(data, what=key)
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or obj.get("schema") != 1 \
            or obj.get("requirements") != reqs or obj.get("env") != env or not isinstance(obj.get("wheels"), list):
        raise ManifestError(f"{key} is not a worker wheel set for these requirements",
                            hint=f"delete {key} from the store; the next bootstrap fetches the wheels again")
    return [Wheel.from_json(w, key) for w in obj["wheels"]]


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
    files.append((f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: jupyter-portable\nVersion: {version}\n".encode()))
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


def _sources(find_links: list[str] | None, index_url: str | None, no_index: bool | None) -> list[str]:
    links = find_links if find_links is not None else \
        [p for p in os.environ.get(FIND_LINKS_ENV, "").split(os.pathsep) if p]
    index = index_url or os.environ.get(INDEX_URL_ENV)
    offline = no_index if no_index is not None else os.environ.get(NO_INDEX_ENV, "") not in ("", "0")
    args: list[str] = []
    for link in links:
        args += ["--find-links", link]
    if offline:
        args.append("--no-index")
    elif index:
        args += ["--index-url", index]
    return args


def _redact(text: str) -> str:
    return re.sub(r"//[^/@\s]+@", "//***@", text)


def fetch_wheels(reqs: list[str], target: Target, dest: Path, *, find_links: list[str] | None = None,
                 index_url: str | None = None, no_index: bool | None = None,
                 progress: Progress | None = None) -> list[Path]:
    """Resolve ``reqs`` for ``target`` with ``uv pip compile`` and download exactly those wheels."""
    import uv

    sources = _sources(find_links, index_url, no_index)
    _say(progress, f"resolving {len(reqs)} requirements for {target.tag} with uv")
    compile_cmd = [uv.find_uv_bin(), "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate",
                   "--python-version", target.version, "--python-platform", target.uv_platform(), *sources]
    proc = subprocess.run(compile_cmd, input="\n".join(reqs) + "\n", capture_output=True, text=True,
                          env={**os.environ, "UV_NO_CONFIG": "1"})
    if proc.returncode != 0:
        raise LaunchFailed(f"uv could not resolve the worker's wheels: {_redact(proc.stderr.strip())[-600:]}",
                           provider="", hint=f"set {FIND_LINKS_ENV} to a folder of wheels, or allow the package "
                                             f"index ({INDEX_URL_ENV}), then Continue again")
    pinned = [line.strip() for line in proc.stdout.splitlines() if line.strip() and not line.startswith("#")]
    dest.mkdir(parents=True, exist_ok=True)
    _say(progress, f"downloading {len(pinned)} wheels")
    platforms = [a for p in target.pip_platforms() for a in ("--platform", p)]
    dl = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
          "--only-binary=:all:", "--dest", str(dest), "--python-version", target.version, "--implementation", "cp",
          *platforms, *sources, *pinned]
    proc = subprocess.run(dl, capture_output=True, text=True)  # the user's pip configuration (proxy, index) holds
    if proc.returncode != 0:
        raise LaunchFailed(f"the worker's wheels could not be downloaded: {_redact(proc.stderr.strip())[-600:]}",
                           provider="")
    return sorted(dest.glob("*.whl"))


def wheel_set(store: Store, target: Target, *, find_links: list[str] | None = None, index_url: str | None = None,
              no_index: bool | None = None, progress: Progress | None = None) -> WheelSet:
    """The worker's wheels for ``target``, from the store (warm) or fetched once and stored (cold)."""
    reqs = requirements(store.url)
    name, data = own_wheel()
    own = _put_wheel(store, data, name)
    found = _read_set(store, reqs, target.tag)
    if found is not None:
        return WheelSet(tuple(reqs), target.tag, tuple(found), own, warm=True)
    with tempfile.TemporaryDirectory(prefix="jp-wheels-") as tmp:
        files = fetch_wheels(reqs, target, Path(tmp), find_links=find_links, index_url=index_url, no_index=no_index,
                             progress=progress)
        wheels = tuple(_put_wheel(store, f.read_bytes(), f.name) for f in files)
    if not any(w.filename.startswith("uv-") for w in wheels):
        raise LaunchFailed("the worker's wheels lack uv for the machine", provider="")
    doc = {"format": FORMAT, "schema": 1, "requirements": reqs, "env": target.tag,
           "wheels": [w.to_json() for w in sorted(wheels, key=lambda w: w.filename)]}
    key = set_key(reqs, target.tag)
    if not store.backend.exists(key):  # a bootstrap racing this one wrote the same set: keep theirs
        with contextlib.suppress(PortableError):
            store.backend.write_new(key, dumps_strict(doc, key).encode())
    _say(progress, f"stored {len(wheels)} wheels for {target.tag}; later machines of this kind are warm")
    return WheelSet(tuple(reqs), target.tag, wheels, own, warm=False)


# -- on the machine ----------------------------------------------------------------------------

_LIST = r'''
import json, os, sys
P = json.loads(sys.argv[2])  # argv[1] is this script itself, in base64
root = os.path.expanduser(P["workdir"])
venv = os.path.join(root, "venvs", P["set"])
have = {}
wheels = os.path.join(root, "wheels")
if os.path.isdir(wheels):
    for name in os.listdir(wheels):
        if name.endswith(".whl.sha256"):
            with open(os.path.join(wheels, name)) as fh:
                have[name[:-7]] = fh.read().strip()
print(json.dumps({"have": have, "ready": os.path.exists(os.path.join(venv, ".complete")),
                  "python": os.path.join(venv, "bin", "python")}))
'''

_INSTALL = r'''
import hashlib, json, os, shutil, stat, subprocess, sys, tarfile, zipfile
P = json.loads(sys.argv[2])  # argv[1] is this script itself, in base64
root = os.path.expanduser(P["workdir"])
wheels = os.path.join(root, "wheels")
os.makedirs(wheels, exist_ok=True)
want = P["wheels"]  # filename -> sha256
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
for name, sha in want.items():  # each checked when it arrived; its sidecar says which bytes it holds
    try:
        with open(os.path.join(wheels, name + ".sha256")) as fh:
            ok = fh.read().strip() == sha and os.path.exists(os.path.join(wheels, name))
    except OSError:
        ok = False
    if not ok:
        sys.exit("wheel %s is missing on the machine" % name)
uvdir = os.path.join(root, "uv", P["uv"][:16])
uvbin = os.path.join(uvdir, "uv")
if not os.path.exists(uvbin):
    os.makedirs(uvdir, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheels, P["uv_wheel"])) as zf:
        inner = [n for n in zf.namelist() if n.endswith("/scripts/uv")]
        if not inner:
            sys.exit("the uv wheel has no uv binary")
        with zf.open(inner[0]) as src, open(uvbin + ".part", "wb") as dst:
            shutil.copyfileobj(src, dst)
    os.chmod(uvbin + ".part", 0o755)
    os.replace(uvbin + ".part", uvbin)
venv = os.path.join(root, "venvs", P["set"])
env = dict(os.environ, UV_CACHE_DIR=os.path.join(root, "uv-cache"), UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never")
shutil.rmtree(venv, ignore_errors=True)
def run(args):
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit("%s failed: %s" % (args[1], (proc.stderr.strip().splitlines() or ["?"])[-1]))
run([uvbin, "venv", "--quiet", "--system-site-packages", "--python", sys.executable, venv])
# no cache: the venv is made once per wheel set, and unpacking straight into it is half the work;
# uv's own wheel is not installed again (its binary is a third of the bytes): the venv links it
run([uvbin, "pip", "install", "--quiet", "--offline", "--no-index", "--no-deps", "--no-cache", "--python",
     os.path.join(venv, "bin", "python")] + [os.path.join(wheels, n) for n in sorted(want) if n != P["uv_wheel"]])
os.symlink(uvbin, os.path.join(venv, "bin", "uv"))
with open(os.path.join(venv, ".complete"), "w") as fh:
    fh.write(P["set"])
print(json.dumps({"python": os.path.join(venv, "bin", "python")}))
'''


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
    sent: int  # wheels sent to the machine
    reused_venv: bool
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"python": self.python, "warm": self.warm_store, "sent": self.sent, "reused_venv": self.reused_venv,
                "seconds": round(self.seconds, 3)}


def bootstrap(exec_remote: Callable[[str, bytes | None, float], tuple[int, bytes, bytes]], store: Store, *,
              workdir: str = "~/.jupyter-portable", python: str = "python3", progress: Progress | None = None,
              clock: Callable[[], float] = time.monotonic, timeout_s: float = 600) -> BootstrapResult:
    """Install the worker on a machine reached by ``exec_remote(command, stdin, timeout) -> (rc, out, err)``;
    returns the Python that runs it there."""
    started = clock()
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

    _say(progress, "asking the machine's python3 what it is")
    rc, out, err = exec_remote(remote_command(python, _PROBE, {}), None, 60)
    if rc != 0:
        raise LaunchFailed(f"the machine has no usable python3: {err.decode(errors='replace').strip()[-300:]}",
                           provider="", hint="the machine needs python3 >= 3.10 on its PATH")
    target = probe_python(lambda _script: out.decode(errors="replace"))
    wset = wheel_set(store, target, progress=progress)
    everything = (*wset.wheels, wset.own)
    state = run(_LIST, {"workdir": workdir, "set": wset.hash})
    if state.get("ready"):
        _say(progress, "the worker is already installed on this machine")
        return BootstrapResult(str(state["python"]), wset.warm, 0, True, clock() - started)
    have: dict[str, Any] = state["have"] if isinstance(state.get("have"), dict) else {}
    missing = [w for w in everything if have.get(w.filename) != w.sha256]
    _say(progress, f"sending {len(missing)} of {len(everything)} wheels to the machine"
                   f"{' (all from the store)' if wset.warm else ''}")
    payload = {"workdir": workdir, "set": wset.hash, "wheels": {w.filename: w.sha256 for w in everything},
               "uv": wset.uv().sha256, "uv_wheel": wset.uv().filename}
    answer = run(_INSTALL, payload, _tar(store, missing))
    _say(progress, "the worker is installed")
    return BootstrapResult(str(answer["python"]), wset.warm, len(missing), False, clock() - started)


def local_target() -> Target:
    """This interpreter, described as a machine's would be."""
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout
    return probe_python(lambda _script: out)


def main(argv: list[str] | None = None) -> int:
    """``python -m jupyter_portable.worker.bootstrap --wheelhouse DIR``: download the worker's wheels
    for this interpreter into DIR, a find-links folder for machines of the same kind (offline tests)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m jupyter_portable.worker.bootstrap")
    parser.add_argument("--wheelhouse", required=True, type=Path)
    args = parser.parse_args(argv)
    files = fetch_wheels(requirements("s3://"), local_target(), args.wheelhouse, find_links=[], no_index=False,
                         progress=print)
    print(f"{len(files)} wheels in {args.wheelhouse}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["FIND_LINKS_ENV", "INDEX_URL_ENV", "NO_INDEX_ENV", "BootstrapResult", "Target", "WheelSet", "bootstrap",
           "fetch_wheels", "own_wheel", "probe_python", "requirements", "wheel_set"]
