"""Walking a workspace directory: what is in it, minus what ``.portableignore`` leaves out."""

from __future__ import annotations

import os
import re
import stat as statmod
import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import blake3
import pathspec

from jupyter_portable.core.errors import PortableError, UnsafePath
from jupyter_portable.core.paths import RESERVED_TOP, check_link_target

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


def _ignore_lines(root: Path) -> list[str]:
    lines = list(DEFAULT_IGNORES)
    try:
        lines += (root / IGNORE_FILE).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        pass
    return lines


def ignore_spec(root: Path) -> pathspec.PathSpec:
    """Default patterns plus the workspace's ``.portableignore`` (gitignore syntax)."""
    return pathspec.GitIgnoreSpec.from_lines(_ignore_lines(root))


def _signature(salt: bytes, names: list[str], stats: list[int]) -> bytes:
    """Names and (size, mtime, ctime, inode) of a folder's regular files, in listing order
    (a folder listed twice unchanged lists in the same order; another order only costs a
    careful listing). A chmod moves the ctime."""
    h = blake3.blake3(salt)
    h.update("\x00".join(names).encode("utf-8", "surrogateescape"))
    try:
        h.update(array("q", stats).tobytes())
    except OverflowError:  # an inode past 2**63
        h.update(repr(stats).encode())
    return h.digest()


class Stat(NamedTuple):
    """The fields of an lstat a walk uses, for a listing made in another process (an
    ``os.stat_result`` costs seven times as much to send or build)."""

    st_mode: int
    st_size: int
    st_mtime_ns: int
    st_ctime_ns: int
    st_ino: int


PlainFile = tuple[str, int, int, int, int, int]  # (name, *Stat) of a regular file
Plain = tuple[list[PlainFile], list[tuple[str, str]], bytes]
"""A plain folder listed elsewhere: files kept by the ignore rules as ``(name, *Stat)``,
subfolders ``(name, absolute path)``, and the listing's signature."""


@dataclass(slots=True)
class Found:
    """One file or symlink found by the walk, with its lstat."""

    path: str
    st: os.stat_result | Stat
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


# Why a file found is not recorded, besides being a special file (kinds of Scan.special).
BACKSLASH = "name with a backslash"
LINK_OUT = "symlink leading outside the workspace"


def special_kind(mode: int) -> str | None:
    """What a special file is ("FIFO", "socket", ...), or None for a file, folder or symlink."""
    return next((name for test, name in _SPECIAL if test(mode)), None)


@dataclass(slots=True)
class Scan:
    """What a walk found: the files and links to record, and the special files it left out."""

    found: list[Found] = field(default_factory=list)
    # (path, kind): never read, never recorded: a special file (its kind), a name with a backslash,
    # a symlink leading outside (BACKSLASH, LINK_OUT)
    special: list[tuple[str, str]] = field(default_factory=list)


@dataclass(slots=True)
class Listing:
    """One folder as a walk sees it: its files and links, its subfolders, its special files."""

    files: list[Found] = field(default_factory=list)
    dirs: list[tuple[str, str]] = field(default_factory=list)  # (name, absolute path)
    special: list[tuple[str, str]] = field(default_factory=list)
    gone: bool = False  # removed (or replaced by a file) while walking
    # What :meth:`Lister.quick` gives for this listing (None: a folder quick cannot vouch for).
    sig: bytes | None = None


_Dirs = list[tuple[str, str]]  # (name, absolute path) of subfolders
_Names = list[str]
_Ints = list[int]


class Lister:
    """Lists one folder at a time with the workspace's ignore rules (what :func:`scan` does
    for the whole tree), so that a walk holds one folder per level, not every file."""

    def __init__(self, root: Path, *, warn: bool = True, strict: bool = True) -> None:
        self.root = root
        lines = _ignore_lines(root)
        self.match = _matcher(pathspec.GitIgnoreSpec.from_lines(lines))
        # A signature holds only under the same ignore rules: they are part of it.
        self.salt = blake3.blake3("\n".join(lines).encode("utf-8", "backslashreplace")).digest()
        self.real_root = os.path.realpath(root)
        self.warn = warn
        self.strict = strict

    def list(self, rel_dir: str, abs_dir: str) -> Listing:
        """The folder ``rel_dir`` ('' for the root), unsorted."""
        out = Listing()
        match, warn, strict = self.match, self.warn, self.strict
        try:
            entries = list(os.scandir(abs_dir))
        except (FileNotFoundError, NotADirectoryError) as exc:
            if rel_dir:
                out.gone = True
                return out  # removed (or replaced by a file) while walking: gone for real
            if strict:
                raise _unreadable("cannot list the workspace folder", abs_dir, "", exc) from exc
            if warn:
                print(f"warning: cannot list {abs_dir}: {exc.strerror}", file=sys.stderr)
            out.gone = True
            return out
        except OSError as exc:
            if strict:
                raise _unreadable(f"cannot list folder {rel_dir!r}" if rel_dir else "cannot list the workspace folder",
                                  abs_dir, rel_dir + "/" if rel_dir else "", exc) from exc
            if warn:
                print(f"warning: cannot list {abs_dir}: {exc.strerror}", file=sys.stderr)
            out.gone = True
            return out
        found = out.files
        names: list[str] | None = []
        stats: list[int] = []
        for entry in entries:
            name = entry.name
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if not rel_dir and name == RESERVED_TOP:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                names = None
                continue  # vanished while walking
            except OSError as exc:
                if strict:
                    raise _unreadable(f"cannot read {rel!r}", entry.path, rel, exc) from exc
                names = None
                continue
            mode = st.st_mode
            if names is not None and not statmod.S_ISDIR(mode):
                if statmod.S_ISREG(mode) and "\\" not in name:
                    names.append(name)
                    stats += (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                else:
                    names = None  # links, special files, odd names: always listed with care
            if statmod.S_ISDIR(mode):
                if not match(rel + "/"):
                    out.dirs.append((name, entry.path))
            elif statmod.S_ISREG(mode):
                if not match(rel):
                    if "\\" in rel:
                        if warn:
                            print(f"warning: skipping {rel!r}: backslash in name", file=sys.stderr)
                        out.special.append((rel, BACKSLASH))
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
                    if real != self.real_root and not real.startswith(self.real_root + os.sep):
                        raise UnsafePath(f"symlink {rel!r} resolves outside the workspace")
                except UnsafePath as exc:
                    if warn:
                        print(f"warning: skipping {exc}", file=sys.stderr)
                    out.special.append((rel, LINK_OUT))
                    continue
                found.append(Found(rel, st, target))
            elif not match(rel):
                # Reading a FIFO blocks until a writer comes; a socket or device has no bytes to keep.
                kind = special_kind(mode) or "special file"
                if warn:
                    print(f"warning: skipping {rel!r}: a {kind} is not a file; it is not recorded", file=sys.stderr)
                out.special.append((rel, kind))
        if names is not None:
            out.sig = _signature(self.salt, names, stats)
        return out

    def plain(self, rel_dir: str, abs_dir: str, most: int) -> Plain | None:
        """What :meth:`list` gives for a folder of regular files and folders alone, as plain
        values to send between processes; None where :meth:`list` must look (a link, a
        special file, a name with a backslash, an error, more than ``most`` files)."""
        if "\\" in rel_dir:
            return None  # list() skips its files, with a warning
        files: list[PlainFile] = []
        dirs: _Dirs = []
        names: _Names = []
        stats: _Ints = []
        prefix = f"{rel_dir}/" if rel_dir else ""
        match = self.match
        isreg, isdir = statmod.S_ISREG, statmod.S_ISDIR
        try:
            with os.scandir(abs_dir) as it:
                for entry in it:
                    name = entry.name
                    if not rel_dir and name == RESERVED_TOP:
                        continue
                    if "\\" in name:
                        return None
                    st = entry.stat(follow_symlinks=False)
                    mode = st.st_mode
                    if isdir(mode):
                        if not match(f"{prefix}{name}/"):
                            dirs.append((name, entry.path))
                    elif isreg(mode):
                        if len(names) >= most:
                            return None
                        size, mtime, ctime, ino = st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino
                        names.append(name)
                        stats += (size, mtime, ctime, ino)
                        if not match(prefix + name):
                            files.append((name, mode, size, mtime, ctime, ino))
                    else:
                        return None
        except OSError:
            return None
        return files, dirs, _signature(self.salt, names, stats)

    def _plain(self, rel_dir: str, abs_dir: str, stat: bool) -> tuple[_Names, _Ints, _Dirs] | None:
        """A folder of regular files and folders alone: every file's name (ignored ones too)
        with, where ``stat``, its (size, mtime, ctime, inode), and the subfolders the ignore
        rules keep; None where :meth:`list` must look (a link, a special file, an odd name,
        an error). Without ``stat`` the listing's entry types decide, with no system call
        where the filesystem gives them."""
        names: _Names = []
        stats: _Ints = []
        dirs: _Dirs = []
        isreg = statmod.S_ISREG
        try:
            with os.scandir(abs_dir) as it:
                for entry in it:
                    name = entry.name
                    if entry.is_dir(follow_symlinks=False):
                        dirs.append((name, entry.path))
                        continue
                    if "\\" in name:
                        return None
                    if stat:
                        st = entry.stat(follow_symlinks=False)
                        if not isreg(st.st_mode):
                            return None
                        stats += (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                    elif not entry.is_file(follow_symlinks=False):
                        return None
                    names.append(name)
        except OSError:
            return None
        prefix = f"{rel_dir}/" if rel_dir else ""
        match = self.match
        subdirs = [(n, p) for n, p in dirs if (rel_dir or n != RESERVED_TOP) and not match(f"{prefix}{n}/")]
        return names, stats, subdirs

    def names(self, rel_dir: str, abs_dir: str) -> tuple[_Names, _Dirs] | None:
        """The names of the folder's regular files that the ignore rules keep (those
        :meth:`list` would find) and its subfolders, with no stat; None where :meth:`list`
        must look."""
        got = self._plain(rel_dir, abs_dir, False)
        if got is None:
            return None
        prefix = f"{rel_dir}/" if rel_dir else ""
        match = self.match
        return [n for n in got[0] if not match(prefix + n)], got[2]

    def quick(self, rel_dir: str, abs_dir: str) -> tuple[bytes, _Dirs] | None:
        """The folder's signature (every regular file's name and lstat, ignored ones too, and the
        ignore rules) and its subfolders, with one stat per file and nothing else; None where
        :meth:`list` must look (a link, a special file, an odd name, an error). Equal to the
        ``sig`` of a :meth:`list` of the same folder while nothing in it changes."""
        got = self._plain(rel_dir, abs_dir, True)
        return None if got is None else (_signature(self.salt, got[0], got[1]), got[2])


def scan(root: Path, *, warn: bool = True, strict: bool = True) -> Scan:
    """Every regular file and in-workspace symlink under ``root`` (sorted by path), and the
    special files (FIFOs, sockets, devices) it skipped.

    ``.portable`` is never included. Symlinks are recorded, never followed; one that
    points outside the workspace is skipped with a warning. A folder that cannot be listed
    (or an entry that cannot be stat'ed) raises :class:`UnreadableDirectory`: its files are
    unknown, and taking them as absent would publish them as deleted. With ``strict=False``
    it is skipped instead (with a warning), for callers that only look.
    """
    lister = Lister(root, warn=warn, strict=strict)
    out = Scan()
    stack = [("", str(root))]
    while stack:
        rel_dir, abs_dir = stack.pop()
        listing = lister.list(rel_dir, abs_dir)
        out.found.extend(listing.files)
        out.special.extend(listing.special)
        stack.extend((f"{rel_dir}/{name}" if rel_dir else name, path) for name, path in listing.dirs)
    out.found.sort(key=lambda f: f.path)
    out.special.sort()
    return out


def _unreadable(what: str, full: str, ignore: str, exc: OSError) -> UnreadableDirectory:
    return UnreadableDirectory(
        f"{what} ({full}): {exc.strerror or exc}; nothing was published, so no file is recorded as deleted",
        hint=f"make it readable, or add {ignore or 'what you want left out'} to {IGNORE_FILE}")


def walk(root: Path, *, warn: bool = True) -> list[Found]:
    """The files and links :func:`scan` finds; a folder that cannot be listed is skipped."""
    return scan(root, warn=warn, strict=False).found
