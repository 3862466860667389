"""Walking a workspace directory: what is in it, minus what ``.portableignore`` leaves out."""

from __future__ import annotations

import os
import re
import stat as statmod
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from jupyter_portable.core.errors import PortableError, UnsafePath
from jupyter_portable.core.paths import check_link_target

IGNORE_FILE = ".portableignore"
DEFAULT_IGNORES = (
    ".ipynb_checkpoints/",
    "__pycache__/",
    ".venv/",
    "node_modules/",
)


def _matcher(spec: pathspec.PathSpec) -> Callable[[str], bool]:
    """A fast ``match_file``: one combined regex when no pattern negates (the usual
    case); pathspec's own last-match-wins loop otherwise."""
    patterns = [p for p in spec.patterns if p.include is not None]
    if any(not p.include for p in patterns) or not all(hasattr(p, "regex") for p in patterns):
        return spec.match_file
    if not patterns:
        return lambda _path: False
    try:
        combined = re.compile("|".join(
            f"(?:{re.sub(r'[(][?]P<[A-Za-z_][A-Za-z0-9_]*>', '(?:', p.regex.pattern)})" for p in patterns))
    except re.error:
        return spec.match_file
    match = combined.match
    return lambda path: match(path) is not None


def ignore_spec(root: Path) -> pathspec.PathSpec:
    """Default patterns plus the workspace's ``.portableignore`` (gitignore syntax)."""
    lines = list(DEFAULT_IGNORES)
    try:
        lines += (root / IGNORE_FILE).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        pass
    return pathspec.GitIgnoreSpec.from_lines(lines)


@dataclass(slots=True)
class Found:
    """One file or symlink found by the walk, with its lstat."""

    path: str
    st: os.stat_result
    target: str | None = None

    @property
    def key(self) -> list[int] | str:
        """What the stat cache remembers: stat fields for a file, the target for a symlink."""
        if self.target is not None:
            return self.target
        st = self.st
        return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class UnreadableDirectory(PortableError):
    """A folder of the workspace could not be listed: its files are unknown, not gone."""


_SPECIAL = ((statmod.S_ISFIFO, "FIFO"), (statmod.S_ISSOCK, "socket"), (statmod.S_ISCHR, "character device"),
            (statmod.S_ISBLK, "block device"))


def special_kind(mode: int) -> str | None:
    """What a special file is ("FIFO", "socket", ...), or None for a file, folder or symlink."""
    return next((name for test, name in _SPECIAL if test(mode)), None)


@dataclass(slots=True)
class Scan:
    """What a walk found: the files and links to record, and the special files it left out."""

    found: list[Found] = field(default_factory=list)
    special: list[tuple[str, str]] = field(default_factory=list)  # (path, kind): never read, never recorded


def scan(root: Path, *, warn: bool = True, strict: bool = True) -> Scan:
    """Every regular file and in-workspace symlink under ``root`` (sorted by path), and the
    special files (FIFOs, sockets, devices) it skipped.

    ``.portable`` is never included. Symlinks are recorded, never followed; one that
    points outside the workspace is skipped with a warning. A folder that cannot be listed
    (or an entry that cannot be stat'ed) raises :class:`UnreadableDirectory`: its files are
    unknown, and taking them as absent would publish them as deleted. With ``strict=False``
    it is skipped instead (with a warning), for callers that only look.
    """
    spec = ignore_spec(root)
    match = _matcher(spec)
    real_root = os.path.realpath(root)
    out = Scan()
    found = out.found
    stack = [("", str(root))]
    while stack:
        rel_dir, abs_dir = stack.pop()
        try:
            entries = list(os.scandir(abs_dir))
        except (FileNotFoundError, NotADirectoryError) as exc:
            if rel_dir:
                continue  # removed (or replaced by a file) while walking: gone for real
            if strict:
                raise _unreadable("cannot list the workspace folder", abs_dir, "", exc) from exc
            if warn:
                print(f"warning: cannot list {abs_dir}: {exc.strerror}", file=sys.stderr)
            continue
        except OSError as exc:
            if strict:
                raise _unreadable(f"cannot list folder {rel_dir!r}" if rel_dir else "cannot list the workspace folder",
                                  abs_dir, rel_dir + "/" if rel_dir else "", exc) from exc
            if warn:
                print(f"warning: cannot list {abs_dir}: {exc.strerror}", file=sys.stderr)
            continue
        for entry in entries:
            name = entry.name
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if not rel_dir and name == ".portable":
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # vanished while walking
            except OSError as exc:
                if strict:
                    raise _unreadable(f"cannot read {rel!r}", entry.path, rel, exc) from exc
                continue
            mode = st.st_mode
            if statmod.S_ISDIR(mode):
                if not match(rel + "/"):
                    stack.append((rel, entry.path))
            elif statmod.S_ISREG(mode):
                if not match(rel):
                    if "\\" in rel:
                        if warn:
                            print(f"warning: skipping {rel!r}: backslash in name", file=sys.stderr)
                        continue
                    found.append(Found(rel, st))
            elif statmod.S_ISLNK(mode):
                if match(rel):
                    continue
                try:
                    target = os.readlink(entry.path)
                except FileNotFoundError:
                    continue  # vanished while walking
                try:
                    check_link_target(rel, target)
                    real = os.path.realpath(entry.path)
                    if real != real_root and not real.startswith(real_root + os.sep):
                        raise UnsafePath(f"symlink {rel!r} resolves outside the workspace")
                except UnsafePath as exc:
                    if warn:
                        print(f"warning: skipping {exc}", file=sys.stderr)
                    continue
                found.append(Found(rel, st, target))
            elif not match(rel):
                # Reading a FIFO blocks until a writer comes; a socket or device has no bytes to keep.
                kind = special_kind(mode) or "special file"
                if warn:
                    print(f"warning: skipping {rel!r}: a {kind} is not a file; it is not recorded", file=sys.stderr)
                out.special.append((rel, kind))
    found.sort(key=lambda f: f.path)
    out.special.sort()
    return out


def _unreadable(what: str, full: str, ignore: str, exc: OSError) -> UnreadableDirectory:
    return UnreadableDirectory(
        f"{what} ({full}): {exc.strerror or exc}; nothing was published, so no file is recorded as deleted",
        hint=f"make it readable, or add {ignore or 'what you want left out'} to {IGNORE_FILE}")


def walk(root: Path, *, warn: bool = True) -> list[Found]:
    """The files and links :func:`scan` finds; a folder that cannot be listed is skipped."""
    return scan(root, warn=warn, strict=False).found
