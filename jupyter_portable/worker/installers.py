"""uv and pip, as the environment build runs them: a venv made, a lockfile's wheels fetched
(a cold build), exactly the given wheels installed offline, each output line passed on with the
credentials of index URLs redacted, and a failure said with the package it concerns.

Index URLs may carry credentials (``https://user:token@host/simple``): they are never stored,
and every message and progress line has ``user:pass@`` in URLs replaced by ``***@``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

from jupyter_portable.core.errors import UsageError
from jupyter_portable.engine.runtime.lockfile import parse_lockfile
from jupyter_portable.worker.wheelindex import WHEEL_NAME, Wheel

_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")
_TAIL = 60
# Where pip names the requirement it failed on, most specific first.
_PIP_PACKAGE = (
    re.compile(r"No matching distribution found for (\S+)"),
    re.compile(r"satisfies the requirement (\S+)"),
    re.compile(r"Failed building wheel for (\S+)"),
    re.compile(r"Failed to build (\S+)"),
    re.compile(r"Could not build wheels for (\S+)"),
)

Progress = Callable[[str], None]


def redact(text: str) -> str:
    """``text`` with the ``user:pass@`` of every URL replaced by ``***@``."""
    return _CREDENTIALS.sub("***@", text)


def _venv_python(venv: Path) -> Path:
    return venv / "Scripts" / "python.exe" if os.name == "nt" else venv / "bin" / "python"


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


def make_venv(python: str, venv: Path, say: Progress, *, system_site: bool = False) -> Path:
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


def pip_python(python: str, venv_python: Path) -> Path:
    """A Python that has pip, to fetch the cold build's wheels: the new venv's (``python -m venv``
    seeds it), else the interpreter the venv is made from."""
    for candidate in (venv_python, Path(python)):
        if subprocess.run([str(candidate), "-c", "import pip"], capture_output=True).returncode == 0:
            return candidate
    raise UsageError(f"neither {venv_python} nor {python} has pip, which fetches the wheels of a cold build",
                     hint=f"install pip for {python}, or build this lockfile once where pip is")


def download_wheels(py: Path, lock_path: Path, any_requirement: bool, wheel_dir: Path, find_links: list[str] | None,
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
    odd = [p.name for p in files if not WHEEL_NAME.fullmatch(p.name)]
    if odd:
        raise UsageError(f"pip left files that are not wheels: {', '.join(odd[:5])}",
                         hint="check the lockfile's requirements")
    return files


def install_wheels(py: Path, lockfile: bytes, wheels: Iterable[Wheel], wheel_dir: Path, tmp: Path,
                   say: Progress) -> None:
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


def install_local(py: Path, files: list[Path], say: Progress) -> None:
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


__all__ = ["Progress", "download_wheels", "install_local", "install_wheels", "make_venv", "pip_python",
           "redact"]
