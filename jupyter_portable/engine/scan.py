"""Walking a workspace directory: what is in it, minus what ``.portableignore`` leaves out."""

from __future__ import annotations

import os
import re
import stat as statmod
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pathspec

from jupyter_portable.core.errors import UnsafePath
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


def walk(root: Path, *, warn: bool = True) -> list[Found]:
    """Every regular file and in-workspace symlink under ``root``, sorted by path.

    ``.portable`` is never included. Symlinks are recorded, never followed; one that
    points outside the workspace is skipped with a warning.
    """
    spec = ignore_spec(root)
    match = _matcher(spec)
    real_root = os.path.realpath(root)
    found: list[Found] = []
    stack = [("", str(root))]
    while stack:
        rel_dir, abs_dir = stack.pop()
        try:
            entries = list(os.scandir(abs_dir))
        except OSError as exc:
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
            except OSError:
                continue  # vanished while walking
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
                target = os.readlink(entry.path)
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
    found.sort(key=lambda f: f.path)
    return found
