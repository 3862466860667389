"""The one gate at the machine boundary (invariant 11, docs/security.md).

Inbound: every file that comes from a machine or a store into the user's copy (follow, restore,
fetch, lazy fetch, the environment's files, conflict copies) is admitted here or not at all.
:meth:`InboundGate.reason` applies, in this order:

1. the path rules (:func:`check_relpath`: relative, normalised, not under ``.portable/``);
2. the deny-list (:data:`RUNS_CODE`): paths that run or configure code on the user's computer
   (``.venv/``, ``site-packages/``, ``__pycache__/``, ``*.pth``, ``.git/hooks/``, startup
   folders, shell profiles, ...), and the copy's own ignore rules (``.portableignore``) once the
   copy has some: a machine never changes what the user shares (a fresh folder has none yet
   and takes the version's). Both are matched on the lower-case path too (a filesystem that
   ignores case takes ``.VENV/`` for ``.venv/``);
3. the user's own ignore rules as they stand on the user's side when the gate is made (never
   the incoming version's): a path the user keeps out of the workspace is not the machine's
   to write.

The user opts a deny-listed path in on the user's side only: gitignore-style patterns, one a
line, in the copy's ``.portable/inbound-allow`` (:meth:`WorkspaceCopy.inbound_allow_lines`), a
file no store or machine ever reads or writes. Opting in never overrides the path rules or the
user's ignore rules.

Every write of bytes from a machine or a store into the user's copy goes through the
:class:`Placer` of :meth:`InboundGate.placer`,
which asks the gate once more for each path it writes. What the gate refuses is kept in
:attr:`InboundGate.refused` with its reason, for the caller to show (CLI, event, log).

Outbound: :func:`outbound_reason` says why a file of the user's copy must not be read to be sent
to a machine (a forwarded save): it is not part of the workspace by the user's ignore rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from jupyter_portable.core.errors import UnsafePath
from jupyter_portable.core.paths import check_relpath, in_reserved
from jupyter_portable.engine.fetch import Placer
from jupyter_portable.engine.listing import IGNORE_FILE, ignore_spec
from jupyter_portable.workdir.workcopy import WorkspaceCopy

# gitignore syntax: paths that run or configure code when the user's Python, shell, git or
# Jupyter meets them. A machine or a store never writes them into the user's copy.
RUNS_CODE: tuple[str, ...] = (
    ".venv/", "venv/", "**/site-packages/", "**/dist-packages/", "__pycache__/", "*.pyc", "*.pth",
    "sitecustomize.py", "usercustomize.py",
    ".git/hooks/", ".git/config",
    ".ipython/", ".jupyter/", "jupyter_*_config.py", "jupyter_*_config.json", "ipython_config.py",
    ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile", ".zshrc", ".zshenv",
    ".zprofile", ".zlogin", ".cshrc", ".tcshrc", ".envrc", ".pythonrc", ".pythonrc.py",
    ".config/", ".local/",
)
_RUNS_CODE = pathspec.GitIgnoreSpec.from_lines(RUNS_CODE)

IGNORED = "ignored by your .portableignore: a path you keep out of the workspace is not the machine's to write"
RUNS = ("runs or configures code on this computer (deny-list); to let it in, add a pattern for it to "
        ".portable/inbound-allow")
RULES = (f"the copy's {IGNORE_FILE}: what you share is yours to change, a machine's version is not applied; "
         "to take it, add it to .portable/inbound-allow")


class Refused(UnsafePath):
    """A path the inbound gate does not let into the user's copy, named with the reason."""


@dataclass(frozen=True)
class Refusal:
    """A path the gate refused, and why."""

    path: str
    reason: str

    def line(self) -> str:
        return f"{self.path}: {self.reason}"

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@dataclass
class InboundGate:
    """The user's side of the boundary for one copy: its rules read once, when the gate is made."""

    root: Path
    ignore: pathspec.PathSpec | None  # the user's ignore rules; None on a machine's own copy
    allow: pathspec.PathSpec | None = None
    own_rules: bool = False  # the copy has ignore rules of its own: a machine's are refused
    refused: list[Refusal] = field(default_factory=list)

    @classmethod
    def for_copy(cls, root: Path) -> InboundGate:
        """The gate of the user's copy at ``root``, its rules as they stand there now."""
        copy = WorkspaceCopy(root)
        allow = copy.inbound_allow_lines()
        return cls(root, ignore_spec(root), pathspec.GitIgnoreSpec.from_lines(allow) if allow else None,
                   own_rules=copy.exists() or (root / IGNORE_FILE).is_file())

    @classmethod
    def machine_side(cls, root: Path) -> InboundGate:
        """A worker's own copy on its machine: the path rules only (its copy is the version's, whole)."""
        return cls(root, None)

    def reason(self, path: str) -> str | None:
        """Why ``path`` may not be written into the copy, or None when it may."""
        try:
            check_relpath(path, what="a path from a machine or a store")
        except UnsafePath as exc:
            return str(exc)
        if self.ignore is None:
            return None
        # a case-insensitive filesystem (macOS, Windows) takes .VENV/ for .venv/: the deny-list and
        # the reserved names are matched on the lower-case path too
        low = path.lower()
        if in_reserved(low):
            return f"{path!r} is the copy's own .portable folder, on a filesystem that ignores case"
        allowed = self.allow is not None and self.allow.match_file(path)
        if low == IGNORE_FILE and self.own_rules and not allowed:
            return RULES
        if (_RUNS_CODE.match_file(path) or _RUNS_CODE.match_file(low)) and not allowed:
            return RUNS
        if self.ignore.match_file(path):
            return IGNORED
        return None

    def ignored(self, path: str) -> bool:
        """Whether the user's ignore rules keep ``path`` out (such a file is never read to be compared or sent)."""
        return self.ignore is not None and bool(self.ignore.match_file(path))

    def admit(self, path: str) -> bool:
        """Whether ``path`` may be written; a refusal is recorded in :attr:`refused`."""
        why = self.reason(path)
        if why is None:
            return True
        self.refused.append(Refusal(path, why))
        return False

    def placer(self) -> Placer:
        """The writer of this copy: it asks the gate again for every path it writes."""
        return Placer(self.root, refuse=self.reason)


def outbound_reason(root: Path, path: str) -> str | None:
    """Why the user's file ``path`` must not be read to be sent to a machine, or None when it may:
    only what the user's ignore rules keep in the workspace leaves the user's side."""
    try:
        check_relpath(path, what="a path sent to a machine")
    except UnsafePath as exc:
        return str(exc)
    if ignore_spec(root).match_file(path):
        return "ignored by your .portableignore: it is not part of the workspace and is never sent to a machine"
    return None


__all__ = ["RUNS_CODE", "InboundGate", "Refusal", "Refused", "outbound_reason"]
