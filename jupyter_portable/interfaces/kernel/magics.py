"""``%workspace``: the workspace from inside a notebook (``%load_ext jupyter_portable``)."""

from __future__ import annotations

import argparse
import os
import pickle
import shlex
import threading
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import display

from jupyter_portable.core.errors import PortableError
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.interfaces.kernel.lock import OPERATION_LOCK
from jupyter_portable.workdir.files import atomic_open

USAGE = """\
%workspace status                       where this workspace stands
%workspace snapshot [-m MSG]            publish the files as a new version
%workspace checkpoint PATH [--step N] [--note TEXT] [--save VAR] [--settle S] [--timeout S] [--wait]
                       [--queue wait|skip-older|keep-both]
                                        register a checkpoint: returns its handle once it is checked
                                        and on local disk; upload and read-back run in the background
                                        (h.wait() or --wait waits for "verified")
%workspace checkpoints                  every registered checkpoint, and those in flight
%workspace latest [--load VAR]          the last verified checkpoint's path (returned); --load VAR
                                        loads it into VAR (torch.load weights_only, or safetensors)
%workspace resume-tag [off]             tag this cell portable-resume: it runs by itself after a Continue
%workspace next TEXT                    say what comes next
%workspace log                          versions, newest first
%workspace diff A B                     what changed between versions A and B
%workspace panel                        the workspace panel
%workspace autosnapshot [MINUTES|off]   show or set the auto-snapshot interval"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"%workspace {self.prog.split()[-1]}: {message}\n\n{USAGE}")

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        raise UsageError(message or USAGE)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%workspace", add_help=False)
    sub = p.add_subparsers(dest="verb", parser_class=_Parser)
    sub.add_parser("status")
    sp = sub.add_parser("snapshot")
    sp.add_argument("-m", "--message", default="")
    sp = sub.add_parser("checkpoint")
    sp.add_argument("path")
    sp.add_argument("--step", type=int)
    sp.add_argument("--note", default="")
    sp.add_argument("--save", metavar="VAR")
    sp.add_argument("--settle", type=float, default=None, metavar="S",
                    help="seconds the file must hold still (default 2; 0.2 with --save)")
    sp.add_argument("--timeout", type=float, default=30.0, metavar="S",
                    help="give up waiting for the file to hold still after this long")
    sp.add_argument("--wait", action="store_true", help="wait for the upload and read-back (verified or rejected)")
    sp.add_argument("--queue", choices=("wait", "skip-older", "keep-both"), default=None,
                    help="what this checkpoint does while older ones are in flight (default skip-older)")
    sub.add_parser("checkpoints")
    sp = sub.add_parser("latest")
    sp.add_argument("--load", metavar="VAR")
    sp = sub.add_parser("resume-tag")
    sp.add_argument("switch", nargs="?", choices=("on", "off"), default="on")
    sp = sub.add_parser("next")
    sp.add_argument("text", nargs="+")
    sub.add_parser("log")
    sp = sub.add_parser("diff")
    sp.add_argument("a", type=int)
    sp.add_argument("b", type=int)
    sub.add_parser("panel")
    sp = sub.add_parser("autosnapshot")
    sp.add_argument("minutes", nargs="?")
    return p


class CellProgress:
    """Progress lines shown in the running cell, updated in place."""

    def __init__(self) -> None:
        self.handle: Any = None
        self._lock = threading.Lock()

    def __call__(self, text: str) -> None:
        with self._lock:
            if self.handle is None:
                self.handle = display({"text/plain": text}, raw=True, display_id=True)
            else:
                self.handle.update({"text/plain": text}, raw=True)


def save_object(obj: Any, path: Path) -> None:
    """Write a kernel object atomically: temp file, fsync, rename (torch.save for state_dicts)."""
    # a temporary name the write check knows as unfinished, renamed into place once whole
    with atomic_open(path) as fh:
        if hasattr(obj, "state_dict"):
            import torch

            torch.save(obj.state_dict(), fh)
        else:
            pickle.dump(obj, fh, protocol=pickle.HIGHEST_PROTOCOL)


@magics_class
class WorkspaceMagics(Magics):
    """The ``%workspace`` line magic."""

    def _workspace(self) -> Workspace:
        try:
            return Workspace.find(os.getcwd())
        except PortableError as exc:
            raise UsageError(exc.one_line()) from exc

    @line_magic
    def workspace(self, line: str) -> Any:
        try:
            argv = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"%workspace: {exc} (check your quotes)") from exc
        if not argv:
            raise UsageError(USAGE)
        args = _parser().parse_args(argv)
        try:
            if args.verb in ("checkpoint", "checkpoints"):
                # a checkpoint's upload takes the lock in its own thread; registering one (or
                # waiting for it) never holds it, nor does listing them while one uploads
                return self._run(args)
            with OPERATION_LOCK:
                return self._run(args)
        except PortableError as exc:
            raise UsageError(exc.one_line()) from exc

    def _run(self, args: argparse.Namespace) -> Any:
        from jupyter_portable.interfaces.kernel import autosnapshot
        from jupyter_portable.interfaces.report import format_checkpoints, format_log, format_status

        ws = self._workspace()
        if args.verb == "status":
            print(format_status(ws.status()))
            return None
        if args.verb == "snapshot":
            res = ws.snapshot(args.message, progress=None, sink=CellProgress(), journal=autosnapshot.journal_cut())
            autosnapshot.record_walk(res)  # `%workspace autosnapshot` shows how the last snapshot walked
            return None
        if args.verb == "checkpoint":
            path = Path(args.path)
            quiet = 2.0 if args.settle is None else args.settle
            if args.save:
                user_ns = self.shell.user_ns if self.shell is not None else {}
                if args.save not in user_ns:
                    raise UsageError(f"--save {args.save}: no variable named {args.save!r} in this kernel")
                save_object(user_ns[args.save], path if path.is_absolute() else Path.cwd() / path)
                if args.settle is None:
                    quiet = 0.2  # we wrote it ourselves, atomically: it is already still
            if quiet < 0 or args.timeout <= 0:
                raise UsageError("--settle must be >= 0 and --timeout > 0")
            handle = ws.checkpoint_async(path, step=args.step, note=args.note, quiet_s=quiet,
                                         timeout_s=args.timeout, policy=args.queue,
                                         echo=CellProgress() if args.wait else None, low_priority=not args.wait)
            if not args.wait:
                step = f" (step {args.step})" if args.step is not None else ""
                if handle.reason is None:
                    print(f"saved and checked: {handle.path}{step}; upload and read-back run in the background "
                          "(`%workspace checkpoints` shows them; it counts once verified)")
                else:
                    print(f"REJECTED: {handle.path}{step}: {handle.reason}")
                # the handle: `h = %workspace checkpoint PATH`, then h.wait(), h.state, h.describe()
                return handle
            record = handle.wait()
            if record is None:
                print(f"SKIPPED: {handle.path}: {handle.reason}")
            elif record.verified:
                print(f"verified: {record.path}" + (f" (step {record.step})" if record.step is not None else "")
                      + f", version {record.version}, blake3 {record.hash[:16] if record.hash else ''}…")
                autosnapshot.checkpoint_verified()
            else:
                print(f"REJECTED: {record.path}: {record.reason}")
            return None
        if args.verb == "checkpoints":
            from jupyter_portable.interfaces.report import format_in_flight

            flying = ws.checkpoints_in_flight()
            print(format_checkpoints(ws.checkpoints())
                  + (f"\nin flight (not verified yet):\n{format_in_flight(flying)}" if flying else ""))
            return None
        if args.verb == "latest":
            latest = ws.latest_checkpoint()
            if latest is None:
                if args.load:
                    raise UsageError(f"--load {args.load}: no verified checkpoint yet (`%workspace checkpoint PATH`)")
                print("no verified checkpoint yet")
                return None
            if args.load:
                if not args.load.isidentifier():
                    raise UsageError(f"--load {args.load!r}: not a Python variable name")
                from jupyter_portable.interfaces.kernel.resume import check_unchanged, load_checkpoint

                check_unchanged(ws.root / latest.path, latest)  # "latest verified" names those bytes only
                value = load_checkpoint(ws.root / latest.path)
                if self.shell is not None:
                    self.shell.user_ns[args.load] = value
                step = f" (step {latest.step})" if latest.step is not None else ""
                print(f"loaded {latest.path}{step}, version {latest.version}, into {args.load}")
                return None
            # returned, not printed too: IPython shows the value once, as the cell's result
            return latest.path
        if args.verb == "resume-tag":
            from jupyter_portable.interfaces.kernel.resume import resume_tag

            resume_tag(on=args.switch == "on")
            return None
        if args.verb == "next":
            from jupyter_portable.workdir.next_action import update_next_action

            update_next_action(ws.copy, text=" ".join(args.text))
            print(f"next: {' '.join(args.text)}")
            return None
        if args.verb == "log":
            print(format_log(ws.log()))
            return None
        if args.verb == "diff":
            print(ws.diff_text(args.a, args.b))
            return None
        if args.verb == "panel":
            from jupyter_portable.interfaces.kernel.panel import panel

            return panel(ws)
        if args.verb == "autosnapshot":
            if args.minutes is None:
                print(autosnapshot.describe())
                return None
            minutes = 0.0 if args.minutes == "off" else _minutes(args.minutes)
            autosnapshot.start(self.shell, minutes)
            print(autosnapshot.describe())
            return None
        raise UsageError(USAGE)


def _minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise UsageError(f"autosnapshot takes minutes or 'off', not {text!r}") from exc
    if value < 0:
        raise UsageError("autosnapshot minutes must not be negative")
    return value
