"""Zero-install bootstrap: a bare machine with ``python3`` >= 3.10 and SSH runs the worker.

What goes to the machine is :mod:`.wheelset`'s (trusted on this side); the machine's
interpreter is asked by :mod:`.interpreter`.

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
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import io
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_portable.core.envplan import EnvChange
from jupyter_portable.core.errors import IntegrityError, LaunchFailed, PortableError, UsageError
from jupyter_portable.store.repo import Store
from jupyter_portable.worker import venvpack
from jupyter_portable.worker.interpreter import PROBE_LIST, Target, local_target, probe_python, target_for
from jupyter_portable.worker.wheelset import Wheel, fetch_wheels, requirements, wheel_set

Progress = Callable[[str], None]
ARCHIVE_ENV = "JUPYTER_PORTABLE_BOOTSTRAP_ARCHIVE"  # "0": uv installs each wheel on the machine (the old way)


def _say(progress: Progress | None, line: str) -> None:
    if progress is not None:
        progress(line)



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
    rc, out, err = exec_remote(remote_command(python, PROBE_LIST, {"workdir": workdir}), None, 60)
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
    args.wheelhouse.mkdir(parents=True, exist_ok=True)

    def fetch(target: Target, into: Path) -> None:
        def say(line: str) -> None:
            print(line if target.tag in line else f"{target.tag}: {line}", flush=True)

        fetch_wheels(requirements("s3://"), target, into, find_links=[], no_index=False, progress=say)

    # every Python at once (each mostly waits on the index), each into a folder of its own: two pip
    # downloads never write one file; a wheel two Pythons share has one name and the same bytes
    with tempfile.TemporaryDirectory(prefix=".fetching-", dir=args.wheelhouse) as tmp:
        parts = [Path(tmp) / str(i) for i in range(len(targets))]
        with ThreadPoolExecutor(max_workers=len(targets)) as pool:
            for done in [pool.submit(fetch, target, part) for target, part in zip(targets, parts, strict=True)]:
                done.result()
        for part in parts:
            for wheel in part.glob("*.whl"):
                os.replace(wheel, args.wheelhouse / wheel.name)
    print(f"{len(list(args.wheelhouse.glob('*.whl')))} wheels in {args.wheelhouse}")
    return 0



if __name__ == "__main__":
    sys.exit(main())


__all__ = ["ARCHIVE_ENV", "BootstrapResult", "bootstrap", "remote_command"]
