"""A worker venv as one archive: the wheels installed once, on the user's side, unpacked on each machine.

Installing the worker's 45 wheels with ``uv`` on every new machine writes each of their ~8,600
files twice (unzipped into a cache, then linked or copied into the venv). Instead the user's
side installs the set once per interpreter, for the machine's Python and platform (``uv pip
install --target --python-version --python-platform``: wheels are unpacked, never built or run),
lays it out as a venv's ``lib/pythonX.Y/site-packages``, ``bin``, ``share`` and ``etc``, and
stores it as one gzip'd tar object. A machine makes an empty venv of its own Python and unpacks
the archive into it in one pass.

The trust boundary is the wheel set's (``worker/trust``, ``docs/security.md`` 3.1): the archive
is made here, from wheels checked against the set this computer holds, never on a machine; a
small document names it, and this computer records that document's digest in its trust file.
A document this computer did not record is used only when the archive built here is the same
bytes. The archive's SHA-256 travels to the machine over SSH, which checks it before unpacking.
Unpacking takes regular files and folders only, every name relative and inside the venv, none
already there (:func:`unpack`).

Store layout, beside the wheel set it was made from::

    objects/<h[:2]>/<h>                    the archive (BLAKE3 of its bytes)
    wheels/worker/<r>/<env>.venv.json      {"format": "jupyter-portable.workervenv", "schema": 1,
                                            "set": <BLAKE3 of the wheel set's bytes>, "env": <env>,
                                            "archive": {"filename", "size", "hash", "sha256"}}

Console scripts in ``bin`` start with a ``/bin/sh`` line that runs the ``python`` beside them,
so they work wherever the venv is. This package's own wheel and ``uv`` are not in the archive:
the first changes with every edit here, the second is a binary the venv links.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from jupyter_portable.core.errors import IntegrityError, ManifestError, PortableError
from jupyter_portable.core.validate import dumps_strict, loads_strict
from jupyter_portable.store.repo import Store, digest
from jupyter_portable.worker import trust

FORMAT = "jupyter-portable.workervenv"
SCHEMA = 1
FILENAME = "worker-venv.tar.gz"
_FIELDS = frozenset({"format", "schema", "set", "env", "archive"})
# the archive's first member: every other member's name, mode and place (see _with_table)
TABLE = ".jupyter-portable-members.json"
TABLE_FORMAT = "jupyter-portable.venvmembers"
_ARCHIVE_FIELDS = frozenset({"filename", "size", "hash", "sha256"})
_HEX64 = re.compile(r"\A[0-9a-f]{64}\Z")
# a console script's first line, made to run the venv's own python wherever the venv lies: sh
# runs the second line; Python reads lines 2-3 as one string and goes on with the script
_RELOCATABLE = (b"#!/bin/sh\n'''exec' \"$(dirname -- \"$(realpath -- \"$0\")\")\"/'python' \"$0\" \"$@\"\n"
                b"' '''\n")
# how build lays a venv out: 2 compiles the modules a kernel imports (see _precompile)
LAYOUT = 2
_TOP = ("bin", "share", "etc", "include")  # what --target puts beside the packages, as in a venv
# what uv writes of this install (the wheel's path here, a time): left out, so the same wheels make the
# same archive, and no machine records a file:// URL of this computer for a package from an index
_INSTALL_RECORDS = frozenset({"direct_url.json", "uv_cache.json"})

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Archive:
    """A worker venv archive in the store: the object and what the machine checks."""

    size: int
    hash: str  # BLAKE3: the store object
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"filename": FILENAME, "size": self.size, "hash": self.hash, "sha256": self.sha256}


def doc_key(set_key: str) -> str:
    """``wheels/worker/<r>/<env>.venv.json`` beside the set ``wheels/worker/<r>/<env>.json``."""
    if not set_key.endswith(".json"):
        raise ManifestError(f"not a wheel set key: {set_key!r}")
    return set_key[:-len(".json")] + ".venv.json"


def _parse(data: bytes, key: str, set_digest: str, env: str) -> Archive:
    obj = loads_strict(data, what=key)
    hint = f"delete {key} from the store; the next Continue makes the archive again"
    if not isinstance(obj, dict) or set(obj) != _FIELDS or obj["format"] != FORMAT or obj["schema"] != SCHEMA \
            or obj["set"] != set_digest or obj["env"] != env:
        raise ManifestError(f"{key} is not the worker venv archive of this wheel set", hint=hint)
    a = obj["archive"]
    if not isinstance(a, dict) or set(a) != _ARCHIVE_FIELDS or a["filename"] != FILENAME \
            or not isinstance(a["size"], int) or isinstance(a["size"], bool) or a["size"] < 0 \
            or not all(isinstance(a[k], str) and _HEX64.match(a[k]) for k in ("hash", "sha256")):
        raise ManifestError(f"{key}: malformed archive entry {a!r:.200}", hint=hint)
    return Archive(a["size"], a["hash"], a["sha256"])


class TooLarge(PortableError):
    """The installed files pass the size an archive is made for."""


def build(wheels: Iterable[Path], python_version: str, uv_platform: str, dest: Path, *, compress: bool = True,
          max_bytes: int | None = None, precompile: Iterable[str] | None = None) -> bytes:
    """Install ``wheels`` (no dependencies, nothing fetched) for CPython ``python_version`` on
    ``uv_platform`` into ``dest``, and return it as a venv archive (a tar, gzip'd with ``compress``):
    the same wheels make the same bytes (on this interpreter). :class:`TooLarge` past ``max_bytes``
    of installed files.

    Where ``python_version`` is this interpreter's own major.minor, the modules a kernel imports
    as it starts (``precompile``: paths under site-packages; default :func:`kernel_modules`) that
    the wheels hold are compiled here too (:func:`_precompile`), so a new machine's first kernel
    does not compile them."""
    from uv import find_uv_bin

    files = [str(w) for w in wheels]
    env = {**os.environ, "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never"}
    proc = subprocess.run([str(find_uv_bin()), "pip", "install", "--quiet", "--target", str(dest), "--no-deps",
                           "--offline", "--no-index", "--python-version", python_version, "--python-platform",
                           uv_platform, *files], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise PortableError("uv could not lay out the worker's venv: "
                            + (proc.stderr.strip().splitlines() or ["no output"])[-1][:300])
    site = "lib/python{}.{}/site-packages".format(*python_version.split(".")[:2])
    if same_minor(python_version):
        _precompile(dest, kernel_modules() if precompile is None else precompile)
    if max_bytes is not None and (total := sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())) > max_bytes:
        raise TooLarge(f"the installed files take {total / 2**20:.0f} MiB, more than an archive is made for "
                       f"({max_bytes / 2**20:.0f} MiB)")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(dest.rglob("*")):
            rel = path.relative_to(dest).as_posix()
            name = rel if rel.split("/", 1)[0] in _TOP else f"{site}/{rel}"
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                raise PortableError(f"uv left {rel} in the worker's venv, which is neither a file nor a folder")
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            if path.parent.name.endswith(".dist-info") and path.name in _INSTALL_RECORDS:
                continue
            data = path.read_bytes()
            if path.parent.name.endswith(".dist-info") and path.name == "RECORD":
                data = b"".join(line for line in data.splitlines(keepends=True)
                                if line.split(b",", 1)[0].rpartition(b"/")[2].decode() not in _INSTALL_RECORDS)
            executable = os.access(path, os.X_OK)
            if name.startswith("bin/") and data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
                data, executable = _RELOCATABLE + data.split(b"\n", 1)[1], True
            info.size, info.mode = len(data), 0o755 if executable else 0o644
            tar.addfile(info, io.BytesIO(data))
    blob = _with_table(raw.getvalue())
    return gzip.compress(blob, compresslevel=6, mtime=0) if compress else blob


# the modules a kernel imports as it starts: IPKernelApp initialized (sockets on loopback, no
# history file, nothing run) and this package's kernel extension imported; written as paths
# relative to site-packages (stdout is the kernel's banner). Run in a process of its own, with a
# scratch IPython and runtime folder.
_KERNEL_MODULES = r"""
import json, os, sys
from ipykernel.kernelapp import IPKernelApp
app = IPKernelApp.instance()
app.initialize(["-f", os.path.join(sys.argv[1], "kernel.json"), "--HistoryManager.enabled=False",
                "--IPKernelApp.quiet=True"])
import jupyter_portable.interfaces.kernel.autosnapshot, jupyter_portable.interfaces.kernel.magics
import jupyter_portable.interfaces.kernel.cell_recorder
found = set()
for module in list(sys.modules.values()):
    path = getattr(module, "__file__", None) or ""
    for part in ("/site-packages/", "/dist-packages/"):
        if path.endswith(".py") and part in path:
            found.add(path.split(part, 1)[1])
with open(os.path.join(sys.argv[1], "modules.json"), "w") as out:
    json.dump(sorted(found), out)
os._exit(0)
"""

# compiles the listed sources under a root into pycs that are never checked against their source
# (PEP 552's unchecked-hash: the archive is immutable, and an unpack does not keep source mtimes),
# in a fresh process with a fixed hash seed, each named by its path under site-packages (the
# import system puts the real path in its code when it loads it), so the same sources make the
# same bytes wherever they were laid out
_COMPILE = r"""
import json, py_compile, sys
root, names = sys.argv[1], json.loads(sys.stdin.read())
for name in names:
    try:
        py_compile.compile(f"{root}/{name}", dfile=name, doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    except py_compile.PyCompileError:
        pass  # left for the machine's Python, which says what is wrong with it if it is ever imported
"""

def same_minor(python_version: str) -> bool:
    """Whether a pyc this CPython writes is one a CPython ``python_version`` reads (the same
    major.minor: the same magic number and cache tag)."""
    return (sys.implementation.name == "cpython"
            and python_version.split(".")[:2] == [str(sys.version_info[0]), str(sys.version_info[1])])


@cache
def kernel_modules() -> tuple[str, ...]:
    """The modules a kernel imports as it starts here, as paths under site-packages; learnt once
    per process from this interpreter's own packages (nothing from the wheels being laid out is
    run). Empty when that cannot be learnt: the machine's kernel then compiles them as before."""
    with tempfile.TemporaryDirectory(prefix="jp-kernel-modules-") as tmp:
        # this Python as it finds its packages (PYTHONPATH kept); none of the user's Jupyter or
        # IPython configuration, startup files or runtime folder
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "IPYTHON"))}
        env.update(IPYTHONDIR=tmp, JUPYTER_RUNTIME_DIR=tmp, JUPYTER_CONFIG_DIR=tmp, JUPYTER_DATA_DIR=tmp)
        try:
            proc = subprocess.run([sys.executable, "-c", _KERNEL_MODULES, tmp], capture_output=True, text=True,
                                  env=env, cwd=tmp, stdin=subprocess.DEVNULL, timeout=120)
            names = json.loads(Path(tmp, "modules.json").read_text()) if proc.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired, ValueError):
            names = []
    ok = isinstance(names, list) and all(isinstance(n, str) and n.endswith(".py") for n in names)
    return tuple(names) if ok else ()


def _precompile(dest: Path, names: Iterable[str]) -> None:
    """Compile the sources among ``names`` (paths relative to ``dest``, as uv's ``--target`` lays
    packages out) that ``dest`` holds, each into its ``__pycache__``. A source that does not
    compile is left for the machine, as any other; if the compiling process fails, none is kept."""
    wanted = sorted({n for n in names if not n.startswith("/") and ".." not in n.split("/")
                     and (dest / n).is_file() and not (dest / n).is_symlink()})
    if not wanted:
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONHASHSEED"] = "0"
    try:
        proc = subprocess.run([sys.executable, "-I", "-c", _COMPILE, str(dest)], input=json.dumps(wanted), text=True,
                              capture_output=True, env=env, timeout=600)
        failed = proc.returncode != 0
    except (OSError, subprocess.TimeoutExpired):
        failed = True
    if failed:  # the layout goes without them (a partly written pyc must not travel)
        from importlib.util import cache_from_source

        for name in wanted:
            Path(cache_from_source(str(dest / name))).unlink(missing_ok=True)


def _with_table(tar_bytes: bytes) -> bytes:
    """``tar_bytes`` with a first member, :data:`TABLE`, listing every other member's name, mode and
    place: a machine reads it in one ``json.loads`` instead of a header at a time (``tarfile``:
    0.4 s for 13,000 members). Offsets count from the end of the table member, so the table does
    not name its own size. The result is still a tar any tool reads; the table is part of the
    archive's bytes, so its hash covers it as it covers the headers."""
    rows: list[list[Any]] = []
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
        for m in tar.getmembers():
            if m.isdir():
                rows.append([m.name, m.mode])
            elif m.isfile():
                rows.append([m.name, m.mode, m.offset_data, m.size])
            else:
                raise PortableError(f"the worker's venv archive has {m.name}, which is neither a file nor a folder")
    table = json.dumps({"format": TABLE_FORMAT, "schema": 1, "members": rows}, separators=(",", ":")).encode()
    info = tarfile.TarInfo(TABLE)
    info.mtime, info.mode, info.size = 0, 0o644, len(table)
    head = info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
    return head + table + bytes(-len(table) % tarfile.BLOCKSIZE) + tar_bytes


def archive_for(store: Store, set_key: str, set_bytes: bytes, env: str, python_version: str, uv_platform: str,
                wheels: Iterable[tuple[str, str, str]], *, progress: Progress | None = None) -> Archive:
    """The venv archive of the wheel set stored at ``set_key`` (its exact bytes ``set_bytes``), for
    the interpreter ``env``: the one this computer recorded, else made here from ``wheels``
    ((filename, object hash, SHA-256) each, checked on the way out of the store) and stored.
    IntegrityError when the store holds another document than the one recorded here."""
    say = progress or (lambda _line: None)
    key = doc_key(set_key)
    set_digest = digest(set_bytes)
    theirs: Archive | None = None
    if store.backend.exists(key):
        data = store.backend.read(key)
        if trust.check(store.url, key, data):
            return _parse(data, key, set_digest, env)
        theirs = _parse(data, key, set_digest, env)
        say(f"{key} was not stored from this computer: making the archive here to compare")
    say(f"laying out the worker's venv for {env} (once per wheel set)")
    with tempfile.TemporaryDirectory(prefix="jp-venv-") as tmp:
        paths = []
        for filename, h, sha in wheels:
            data = store.get_object(h, what=f"wheel {filename}")
            if hashlib.sha256(data).hexdigest() != sha:
                raise IntegrityError(f"wheel {filename} in the store does not match its recorded SHA-256")
            path = Path(tmp) / "wheels" / filename
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(data)
            paths.append(path)
        blob = build(paths, python_version, uv_platform, Path(tmp) / "venv")
    mine = Archive(len(blob), store.put_object(blob) if not store.has_object(h := digest(blob)) else h,
                   hashlib.sha256(blob).hexdigest())
    doc = dumps_strict({"format": FORMAT, "schema": SCHEMA, "set": set_digest, "env": env,
                        "archive": mine.to_json()}, key).encode()
    if theirs is None:
        try:
            store.backend.write_new(key, doc)
        except PortableError:  # another Continue stored one first: theirs, if it is the same archive
            data = store.backend.read(key)
            theirs = _parse(data, key, set_digest, env)
            if theirs == mine:
                trust.record(store.url, key, data)
            return mine
        trust.record(store.url, key, doc)
        say(f"stored the worker's venv for {env} ({len(blob) / 2**20:.1f} MiB); later machines unpack it")
        return mine
    if theirs == mine:
        trust.record(store.url, key, store.backend.read(key))
    else:
        say(f"{key} names another archive than the one made here: using the one made here")
    return mine


def unpack(entries: Iterable[tuple[str, bytes | memoryview | None, int]], dest: str,
           threads: int | None = None) -> int:
    """Write ``entries`` ((name, bytes or None for a folder, mode) each) under the folder ``dest``:
    every name relative, no ``..``, nothing written through a link or over a file already there.
    Returns the number of files. Stdlib only: the bootstrap runs it on the machine's bare Python.

    Names are checked and folders made here, in order; the files are written by ``threads``
    threads (default: the cores, at most 4) in batches, their system calls side by side. The
    first error stops the rest and is raised once the writes under way have ended."""
    import os as _os
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    root = _os.path.realpath(dest)
    made = set()
    count = 0
    threads = threads or min(4, _os.cpu_count() or 1)

    def folder(rel: str) -> None:
        if rel in made or rel == "":
            return
        folder(rel.rpartition("/")[0])
        path = _os.path.join(root, rel)
        if not _os.path.isdir(path):
            _os.mkdir(path, 0o755)
        if _os.path.islink(path) or not _os.path.realpath(path).startswith(root + _os.sep):
            raise ValueError(f"refusing {rel!r}: it leads out of the venv")
        made.add(rel)

    def write(batch: list) -> None:
        for path, data, perm in batch:
            fd = _os.open(path, _os.O_WRONLY | _os.O_CREAT | _os.O_EXCL | _os.O_NOFOLLOW, perm)
            try:
                view = memoryview(data)
                while view:
                    view = view[_os.write(fd, view):]
            finally:
                _os.close(fd)

    pool = ThreadPoolExecutor(threads, thread_name_prefix="unpack")
    running: set = set()
    batch: list = []
    size = 0

    def settle(most: int) -> None:
        """Wait until at most ``most`` batches are under way; a failed one's error is raised."""
        nonlocal running
        while len(running) > most:
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                fut.result()

    try:
        for name, data, mode in entries:
            parts = name.split("/")
            if not name or name.startswith("/") or "\\" in name or "\0" in name \
                    or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"refusing archive member {name!r}")
            if data is None:
                folder(name)
                continue
            folder(name.rpartition("/")[0])
            batch.append((_os.path.join(root, name), data, 0o755 if mode & 0o111 else 0o644))
            size += len(data)
            count += 1
            if len(batch) >= 64 or size >= 8 << 20:
                settle(2 * threads)
                running.add(pool.submit(write, batch))
                batch, size = [], 0
        if batch:
            running.add(pool.submit(write, batch))
        settle(0)
    finally:
        for fut in running:
            fut.cancel()
        pool.shutdown(wait=True)
    return count


def tar_entries(blob: bytes) -> Iterable[tuple[str, bytes | memoryview | None, int]]:
    """The entries of a venv archive (a tar, gzip'd or not): regular files and folders, anything else
    refused. An archive whose first member is the member table (``build`` writes one) is read from
    the table alone; one without is read a header at a time."""
    import gzip as _gzip
    import io as _io
    import json as _json
    import tarfile as _tarfile

    raw = _gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob
    view = memoryview(raw)
    with _tarfile.open(fileobj=_io.BytesIO(raw), mode="r:") as tar:
        first = tar.next()  # read when the tar was opened: no second read
        if first is not None and first.name == ".jupyter-portable-members.json" and first.isfile():
            base = first.offset_data + first.size + (-first.size % 512)
            doc = _json.loads(bytes(view[first.offset_data:first.offset_data + first.size]))
            rows = doc.get("members") if isinstance(doc, dict) and doc.get("format") == "jupyter-portable.venvmembers" \
                and doc.get("schema") == 1 else None
            if not isinstance(rows, list):
                raise ValueError("the archive's member table is not one this version reads")
            for row in rows:
                if not isinstance(row, list) or len(row) not in (2, 4) or not isinstance(row[0], str) \
                        or not all(type(v) is int and v >= 0 for v in row[1:]) or row[1] > 0o7777:
                    raise ValueError(f"the archive's member table has a malformed row {row!r:.200}")
                if len(row) == 2:
                    yield row[0], None, row[1]
                    continue
                start = base + row[2]
                if start + row[3] > len(raw):
                    raise ValueError(f"the archive's member table places {row[0]!r} past the archive's end")
                yield row[0], view[start:start + row[3]], row[1]
            return
        for m in tar.getmembers():
            if m.isdir():
                yield m.name, None, m.mode
            elif m.isfile():
                yield m.name, view[m.offset_data:m.offset_data + m.size], m.mode
            else:
                raise ValueError(f"refusing archive member {m.name!r}: not a file or a folder")


def zip_entries(path: str) -> Iterable[tuple[str, bytes | memoryview | None, int]]:
    """The files of a wheel (a zip) as :func:`unpack` takes them."""
    import zipfile as _zipfile

    with _zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.is_dir():
                yield info.filename.rstrip("/"), None, 0o755
            else:
                yield info.filename, zf.read(info), (info.external_attr >> 16) & 0o777


__all__ = ["FILENAME", "FORMAT", "TABLE", "TABLE_FORMAT", "Archive", "TooLarge", "archive_for", "build", "doc_key",
           "tar_entries", "unpack", "zip_entries"]
