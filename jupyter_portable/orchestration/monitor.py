"""What the server extension does besides answering requests: the workspace it serves,
Continue in the background, the loss monitor and idle autostop, reservations that start, files saved in
JupyterLab forwarded to the worker, and the events that tell the sidebar about all of it.

Blocking work (the orchestrator, the store) runs on threads; events are emitted on the
server's IO loop, where jupyter_events' listeners live.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from tornado.ioloop import IOLoop, PeriodicCallback

from jupyter_portable.compute.base import Provider
from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.envconfig import PortableRun
from jupyter_portable.core.errors import ConflictError, PortableError
from jupyter_portable.core.paths import in_reserved
from jupyter_portable.core.times import now_iso
from jupyter_portable.engine.gate import outbound_reason
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.orchestration.agreed import AgreedHashes
from jupyter_portable.orchestration.hosting import ServerApp, ServerLoop
from jupyter_portable.orchestration.idle import IdleWatch
from jupyter_portable.orchestration.orchestrator import Orchestrator
from jupyter_portable.orchestration.state_view import StateView
from jupyter_portable.orchestration.walltime import END_CHECK_S, JobEnd
from jupyter_portable.store.repo import digest
from jupyter_portable.workdir.conflicts import add_conflict, read_conflicts, resolve_conflicts

STATE_SCHEMA = "https://events.jupyter-portable.org/state/v1"
PROGRESS_SCHEMA = "https://events.jupyter-portable.org/progress/v1"
NOTICE_SCHEMA = "https://events.jupyter-portable.org/notice/v1"
CHANGED_SCHEMA = "https://events.jupyter-portable.org/changed/v1"
SCHEMAS = (("state.yaml", STATE_SCHEMA), ("progress.yaml", PROGRESS_SCHEMA), ("notice.yaml", NOTICE_SCHEMA),
           ("changed.yaml", CHANGED_SCHEMA))
WATCHED_DOCS = ("settings", "reservations")  # a change to either, from anywhere, is news for the sidebar

log = logging.getLogger("jupyter_portable.server")
_SERVICES: dict[str, "PortableService"] = {}


def service_for(root: Path | str) -> "PortableService | None":
    """The running server's service for the workspace at ``root`` (None outside a server)."""
    return _SERVICES.get(str(Path(root).resolve()))


class PortableService:
    """One per server: the workspace copy the server was started in."""

    def __init__(self, serverapp: ServerApp, ws: Workspace | None, *, check_interval_s: float = 2.0,
                 reservation_interval_s: float = 30.0,
                 providers: Callable[[], dict[str, Provider]] | None = None, environment: str | None = None,
                 first_machine: str = "first-cell", boot_timeout: str | None = None,
                 pass_env: list[str] | None = None, now: Callable[[], datetime] | None = None) -> None:
        self.serverapp = serverapp
        self.check_interval_s = check_interval_s  # how soon a lost machine is seen: the routes' time to notice
        # the calendar's clock (interfaces.clock: c.Portable.now), for bookings and reservation starts
        self.now: Callable[[], datetime] = now or (lambda: datetime.now(timezone.utc))
        self.environment = environment  # c.Portable.environment; None: the orchestrator's default
        self.first_machine = first_machine  # c.Portable.first_machine: who rents the first machine
        self.boot_timeout = boot_timeout  # c.Portable.boot_timeout; None: the orchestrator's default
        self.pass_env = pass_env  # c.Portable.pass_env; None: the orchestrator's default
        self.ws = ws
        self.loop = cast(ServerLoop, IOLoop.current())  # an AsyncIOLoop since tornado 5: it has asyncio_loop
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="portable")
        self.continuing: Future[Any] | None = None
        self.orch: Orchestrator | None = None
        self.make_providers = providers  # None: the environment's (compute.registry)
        self.view = StateView(ws, self.orchestrator, calendar=self.now) if ws is not None else None
        self.idle = IdleWatch(ws, self.orchestrator, notice=self.notice,
                              restarted=lambda: self._changed("idle")) if ws is not None else None
        self.job_end = JobEnd(self.notice)  # a machine that ends by itself: its successor, or the user asked
        self.synced = AgreedHashes()  # path -> the hash both sides agreed on last, with the serving worker
        self.started_reservations: set[str] = set()
        self._checking = False
        self._told_spend: tuple[str | None, int] | None = None  # the machine and its spend in cents, as last told
        self._told_checkpoints: tuple[tuple[str, str], ...] = ()  # the checkpoints in flight, as last told
        self._lock = threading.Lock()
        self._head_version: int | None = None
        self._docs: dict[str, str] = {}  # the watched documents as last seen (canonical JSON)
        self._told_moved: str | None = None  # the allocation whose "Now on ..." notice was sent
        self._told_seq: int | None = None  # the newest lifecycle event told as a state event
        self._told_lock = threading.Lock()
        if ws is not None:
            _SERVICES[str(ws.root)] = self
        self._timers = [PeriodicCallback(self._tick_check, check_interval_s * 1000),
                        PeriodicCallback(self._tick_reservations, reservation_interval_s * 1000),
                        # a job's known end has come: looked at more often for a while (walltime.py)
                        PeriodicCallback(self._tick_end, END_CHECK_S * 1000)]

    # -- events -----------------------------------------------------------------------------

    def emit(self, schema: str, data: dict[str, Any]) -> None:
        def go() -> None:
            try:
                self.serverapp.event_logger.emit(schema_id=schema, data=data)
            except Exception:
                log.exception("jupyter-portable: could not emit %s", schema)

        self.loop.add_callback(go)

    def _claim(self, seq: object) -> bool:
        """Whether lifecycle event ``seq`` is yet to be told (and now counts as told): each once,
        whether this server's orchestrator made it or another process did."""
        if not isinstance(seq, int):
            return True
        with self._told_lock:
            if self._told_seq is not None and seq <= self._told_seq:
                return False
            self._told_seq = seq
            return True

    def on_state(self, ev: dict[str, Any]) -> None:
        if not self._claim(ev.get("seq")):
            return
        data = {k: ev.get(k) for k in ("workspace_id", "seq", "state", "previous", "reason", "allocation_id",
                                       "route", "version", "epoch", "at")}
        data["verified"] = ev["state"] in L.VERIFIED_STATES
        data["detail"] = ev.get("detail") or {}
        self.emit(STATE_SCHEMA, data)
        if ev["state"] in (L.LOST, L.RELEASED):
            self.pool.submit(self._park_kernels)  # issue 16: no machine, no hanging cells
        kind = {L.LOST: "lost", L.ACTIVE: "ready", L.FAILED: "failed"}.get(ev["state"])
        if kind == "ready" and ev.get("allocation_id") and ev.get("allocation_id") == self._told_moved:
            kind = None  # "Now on ..." (the move of the kernels) already said it: one toast, not two
        if kind:
            from jupyter_portable.orchestration.kernel_moves import machine_words

            machine = "the GPU machine"
            if kind in ("lost", "ready") and self.ws is not None:  # named as the researcher knows it, not by id
                rec = next((a for a in reversed(self._history_records())
                            if a.get("allocation_id") == ev.get("allocation_id")), None)
                machine = machine_words(rec, "the GPU machine")
            text = {"lost": f"{machine[0].upper()}{machine[1:]} was lost: {ev.get('reason')}",
                    "ready": f"Ready on {machine}, workspace version {ev.get('version')} verified",
                    "failed": f"Continue failed: {ev.get('reason')}"}[kind]
            self.notice(kind, text)

    def on_progress(self, ev: dict[str, Any]) -> None:
        self.emit(PROGRESS_SCHEMA, ev)

    def notice(self, kind: str, message: str) -> None:
        if self.ws is not None:
            self.emit(NOTICE_SCHEMA, {"workspace_id": self.ws.workspace_id, "kind": kind, "message": message[:1000]})

    # -- the orchestrator -----------------------------------------------------------------------

    def orchestrator(self) -> Orchestrator:
        if self.ws is None:
            raise PortableError("this server was not started in a workspace",
                                hint="start JupyterLab inside a workspace folder (`jupyter portable init`)")
        if self.orch is None:
            self.orch = Orchestrator(self.ws, on_state=self.on_state, on_progress=self.on_progress,
                                     reconnect=self.reconnect,
                                     providers=self.make_providers() if self.make_providers else None,
                                     environment={"mode": self.environment} if self.environment else None,
                                     pass_env=self.pass_env, boot_timeout=self.boot_timeout)
        return self.orch

    def start(self) -> None:
        if self.ws is None:
            return
        for t in self._timers:
            t.start()
        # a server restarted mid-Continue finishes or rolls back what was in flight
        lc = self.orchestrator().lifecycle()
        if lc.state not in L.CONTINUE_FROM and lc.state != L.ACTIVE:
            self.continuing = self.pool.submit(self._resume_then_go_on)

    def _resume_then_go_on(self) -> Any:
        orch = self.orchestrator()
        try:
            summary = orch.resume()
            if summary["state"] == L.ROUTING:
                return orch.continue_()
            return summary
        except ConflictError as exc:  # another process (a terminal's `continue`) drives it
            log.warning("jupyter-portable: not resuming the Continue: %s", exc.one_line())
            raise
        except Exception as exc:
            # never leave the workspace half-way with nothing driving it: the sidebar could
            # neither cancel nor Continue
            log.warning("jupyter-portable: resuming the Continue after a restart failed: %s",
                        exc.one_line() if isinstance(exc, PortableError) else repr(exc), exc_info=True)
            try:
                orch.abandon(exc)
            except PortableError as again:
                log.warning("jupyter-portable: could not mark the Continue failed: %s", again.one_line())
            raise

    def pause_monitor(self) -> None:
        """Stop the periodic loss check and reservation starts (the server goes on serving)."""
        for t in self._timers:
            t.stop()

    def stop_timers(self) -> None:
        if self.ws is not None and _SERVICES.get(str(self.ws.root)) is self:
            del _SERVICES[str(self.ws.root)]
        self.pause_monitor()
        if self.orch is not None:
            self.orch.cancel()
            self.orch.close()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def is_continuing(self) -> bool:
        return self.continuing is not None and not self.continuing.done()

    def start_continue(self, route_id: str | None, *, queued: Any = None) -> None:
        """Continue in the background; ``queued``: the offer of a machine queued ahead that the
        route goes onto (``Orchestrator.continue_``)."""
        orch = self.orchestrator()
        with self._lock:
            if self.is_continuing():
                raise ConflictError("a Continue is already running", hint="wait for it, or cancel it")
            lc = orch.lifecycle()
            if lc.state == L.ACTIVE:
                # the machine may have just gone: look once before refusing
                orch.check()
                lc = orch.lifecycle()
            if lc.state not in L.CONTINUE_FROM:
                raise ConflictError(f"the workspace is {lc.state} on {lc.allocation_id}",
                                    hint="stop it first" if lc.state == L.ACTIVE else "wait for it to finish")

            def run() -> Any:
                try:
                    return orch.continue_(route_id, queued=queued)
                except PortableError as exc:
                    log.warning("jupyter-portable: Continue failed: %s", exc.one_line())
                    raise

            self.continuing = self.pool.submit(run)

    # -- reconnecting the notebook's kernels ------------------------------------------------------

    def reconnect(self, record: Any, timeout_s: float = 120.0) -> None:
        """Move every portable kernel of this workspace to the new worker, keeping its id.

        Issue 16: a plain restart of each kernel, not the restarter's auto-restart, so JupyterLab
        shows no "kernel died" dialog; its websockets are dropped and the notebook reconnects to
        the new ports; then a notice names the machine (orchestration/kernel_moves.py)."""
        from jupyter_portable.orchestration.kernel_moves import (
            fell_back_records,
            machine_words,
            moved_message,
            restart_kernels,
        )

        assert self.ws is not None
        restart_kernels(self.serverapp, self.loop, list(self._portable_kernels(running_only=True)), timeout_s)
        elsewhere = [kid for kid, prov in self._portable_kernels(running_only=True).items()
                     if prov.allocation_id != record.allocation_id]
        if elsewhere:
            raise PortableError(f"kernel(s) {', '.join(elsewhere)} did not restart on {record.allocation_id}")
        moved = len(self._portable_kernels(running_only=True))
        history = self._history_records()
        rec = next((a for a in reversed(history) if a.get("allocation_id") == record.allocation_id),
                   {"provider": record.allocation.provider, "offer": record.allocation.offer_id})
        where = machine_words(rec)
        message = ("no notebook kernel to move yet: the first one starts on " + where if moved == 0
                   else f"the notebook's kernel now runs on {where}" if moved == 1
                   else f"{moved} notebook kernels now run on {where}")
        self.on_progress({"workspace_id": self.ws.workspace_id, "step": "reconnect", "message": message,
                          "done": moved, "total": moved})
        self.notice("moved", moved_message(rec, self.orchestrator().lifecycle().version,
                                           record.allocation.details.get("environment_built"),
                                           fell_back_records(history, record.allocation_id)))
        self._told_moved = record.allocation_id

    def _history_records(self) -> list[dict[str, Any]]:
        assert self.ws is not None
        with contextlib.suppress(PortableError):
            head, _ = self.ws.store.read_head(self.ws.workspace_id)
            if head.version:
                return list(self.ws.store.read_manifest(self.ws.workspace_id, head.version).allocations)
        return []

    def _park_kernels(self) -> None:
        """Issue 16: the machine is gone; each kernel on it restarts as a local placeholder that answers
        every cell at once with "No GPU machine" (orchestration/provisioner.py)."""
        from jupyter_portable.orchestration.kernel_moves import restart_kernels

        if not self.loop.asyncio_loop.is_running():
            return  # the server has stopped: nothing would restart them (provisioner.py ends each at once)
        on_machine = [kid for kid, prov in self._portable_kernels(running_only=True).items()
                      if prov.allocation_id is not None]
        try:
            restart_kernels(self.serverapp, self.loop, on_machine)
        except PortableError as exc:
            log.warning("jupyter-portable: %s", exc.one_line())

    def _watch_head(self) -> None:
        """A version published on the worker (a snapshot, a checkpoint) is news for the sidebar."""
        assert self.ws is not None
        head, _ = self.ws.store.read_head(self.ws.workspace_id)
        if self._head_version is not None and head.version != self._head_version:
            m = self.ws.store.read_manifest(self.ws.workspace_id, head.version)
            self.on_progress({"workspace_id": self.ws.workspace_id, "step": "snapshot",
                              "message": f"version {head.version}: {m.message}"[:500],
                              "done": head.version, "total": head.version})
        self._head_version = head.version

    def watch_checkpoints(self) -> bool:
        """Checkpoints on their way to verified (here, or on the machine as its worker last said): each
        time one moves or ends, the sidebar is told (changed/v1 "checkpoints") and reads the state."""
        if self.view is None:
            return False
        seen = tuple((r["key"], r["line"]) for r in self.view.checkpoints_in_flight())
        if seen == self._told_checkpoints:
            return False
        self._told_checkpoints = seen
        self._changed("checkpoints")
        return True

    def watch_docs(self) -> list[str]:
        """The workspace's settings and bookings as the store holds them now: each that changed since
        the last look (a terminal's `jupyter portable settings` or `reserve` as much as the sidebar)
        rebuilds the state, restarts the idle countdown (settings) and is told to the sidebar
        (changed/v1). The first look only remembers. The names of the documents that changed."""
        import json

        assert self.ws is not None
        changed = []
        for name in WATCHED_DOCS:
            try:
                seen = json.dumps(self.ws.store.read_doc(self.ws.workspace_id, name), sort_keys=True)
            except (PortableError, ValueError):
                continue
            before = self._docs.get(name)
            self._docs[name] = seen
            if before is not None and before != seen:
                changed.append(name)
        if changed and self.view is not None:
            self.view.invalidate()
        if "settings" in changed and self.idle is not None:
            self.idle.settings_changed()
        for name in changed:
            self._changed(name)
        return changed

    def _changed(self, what: str) -> None:
        if self.ws is not None:
            self.emit(CHANGED_SCHEMA, {"workspace_id": self.ws.workspace_id, "what": what})

    def documents_changed(self, what: str) -> None:
        """This server changed the workspace's settings or bookings (``what``: the document): the
        state is built again at the next ask, the idle check reads idle_minutes again, and the
        sidebar is told at once. The watch alone would miss a change undone within one of its
        looks (a budget set and cleared), and a sidebar's dry run would keep the first one's answer."""
        if self.view is not None:
            self.view.invalidate()
        if self.idle is not None:
            self.idle.settings_changed()
        self._changed(what)

    def spend_figure(self) -> Any:
        """An active machine's spend as the loss check last saw it (what the state's budget uses)."""
        from jupyter_portable.orchestration.state_view import observed_figure

        return observed_figure(self.orchestrator())

    def _portable_kernels(self, *, running_only: bool) -> dict[str, Any]:
        """Kernel id -> provisioner, for this workspace's portable kernels (a kernel still starting
        asks for the workspace's machine itself, once one is ready)."""
        km = self.serverapp.kernel_manager
        root = str(self.ws.root) if self.ws else None
        out = {}
        for kid in list(km.list_kernel_ids()):
            prov = getattr(km.get_kernel(kid), "provisioner", None)
            if getattr(prov, "workspace_root", None) != root or not hasattr(prov, "is_placeholder"):
                continue
            if running_only and not getattr(prov, "has_process", False):
                continue
            out[kid] = prov
        return out

    def _tell_changes_made_elsewhere(self, lc: L.Lifecycle) -> None:
        """State events for the lifecycle changes another process made (`jupyter portable stop` in a
        terminal), so the toolbar and the sidebar hear of them as of this server's own; the first
        look only notes where the lifecycle stands."""
        with self._told_lock:
            if self._told_seq is None:
                self._told_seq = lc.last_seq
                return
            told = self._told_seq
        for ev in lc.events:
            if ev.seq > told:
                self.on_state({"workspace_id": lc.workspace_id, **ev.to_json()})

    def _kernels_elsewhere(self, allocation_id: str | None) -> bool:
        return any(prov.allocation_id not in (None, allocation_id)
                   for prov in self._portable_kernels(running_only=True).values())

    # -- the loss monitor -------------------------------------------------------------------------

    def _tick_end(self) -> None:
        if self.job_end.due(self.now()):
            self._tick_check()

    def _tick_check(self) -> None:
        if self._checking or self.is_continuing() or self.ws is None:
            return
        self._checking = True

        def check() -> None:
            try:
                orch = self.orchestrator()
                lc = orch.lifecycle()
                self._tell_changes_made_elsewhere(lc)
                if lc.state in (L.ACTIVE, L.READY):
                    was = orch.unreachable()
                    orch.check()
                    self._tell_reachability(was, orch.unreachable())
                    orch.refresh_credentials()  # the worker's store credentials, before they expire
                    self._tell_spend(orch, lc.allocation_id)
                if lc.state in (L.ACTIVE, L.READY, L.LOST):  # a job's known end (orchestration/walltime.py)
                    take_over = self.job_end.look(orch, self.now())
                    if take_over is not None:
                        self.start_continue(take_over, queued=self.job_end.offer_for(take_over))
                        return
                if self.idle is not None and orch.lifecycle().state == L.ACTIVE:
                    self.idle.check()  # seals and releases a machine idle for the workspace's idle_minutes
                self._watch_head()
                self.watch_checkpoints()
                self.watch_docs()
                if lc.state == L.ACTIVE and self._kernels_elsewhere(lc.allocation_id):
                    # another process (`jupyter portable continue` in a terminal) moved the workspace
                    record = orch.record(lc.allocation_id)
                    if record is not None:
                        self.reconnect(record)
            except PortableError as exc:
                log.info("jupyter-portable: the check failed: %s", exc.one_line())
            finally:
                self._checking = False

        self.pool.submit(check)

    # -- reservations: a slot's start triggers a Continue on it ----------------------------------

    def _tell_spend(self, orch: Orchestrator, allocation_id: str | None) -> None:
        """While a machine runs its spend grows: each cent it moves, the state is built again and the
        sidebar told ("budget"), so the spend line, the budget's left and the routes' refusals tick
        with it, all from the one report (orchestration/budget.py)."""
        cents = self.view.spend_cents(orch, allocation_id) if self.view is not None else None
        if cents is None or (allocation_id, cents) == self._told_spend:
            return
        self._told_spend = (allocation_id, cents)
        self.view.invalidate()  # type: ignore[union-attr]
        self._changed("budget")

    def _tell_reachability(self, was: dict[str, Any] | None, now: dict[str, Any] | None) -> None:
        """A notice when the machine stops answering, and when it answers again (issue 42)."""
        if was is None and now is not None:
            self.notice("unreachable", f"The GPU machine is {now['line']}: nothing is released while its provider "
                                       f"may still run it, and the session goes on when it answers"
                                       + (f" ({now['reason']})" if now.get("reason") else ""))
        elif was is not None and now is None and self.ws is not None:
            lc = self.orchestrator().lifecycle()
            if lc.state in (L.ACTIVE, L.READY) and lc.allocation_id == was.get("allocation_id"):
                self.notice("reachable", f"The GPU machine answers again ({was['line']}); nothing was lost")

    def _tick_reservations(self) -> None:
        if self.ws is None or self.is_continuing():
            return
        self.pool.submit(self.start_due_reservation)

    def start_due_reservation(self, now: datetime | None = None) -> str | None:
        """Continue on the offer of a booked slot that has started; the reservation id, or None."""
        from datetime import timedelta

        from jupyter_portable.core.routing import route_id
        from jupyter_portable.orchestration.reservations import reservations

        assert self.ws is not None
        now = now or self.now()
        orch = self.orchestrator()
        for b in reservations(self.ws):
            end = b.start + timedelta(hours=b.hours)
            if b.status != "booked" or not (b.start <= now < end) or b.reservation_id in self.started_reservations:
                continue
            if orch.lifecycle().state not in L.CONTINUE_FROM:
                return None
            self.started_reservations.add(b.reservation_id)
            provider, _, offer_id = b.offer_key.partition("/")
            offers = [o for o in orch.providers[provider].offers() if o.id == offer_id] \
                if provider in orch.providers else []
            if not offers:
                self.notice("failed", f"reservation {b.reservation_id}: {b.offer_key} is no longer offered")
                return None
            self.notice("ready", f"reservation {b.reservation_id} started: continuing on {b.offer_key}")
            self.start_continue(route_id(offers[0]))
            return b.reservation_id
        return None

    # -- files saved in JupyterLab go to the worker -------------------------------------------------

    def post_save(self, model: Any = None, os_path: str | None = None, contents_manager: Any = None,
                  **_: Any) -> None:
        if self.ws is None or not os_path:
            return
        root = self.ws.root
        try:
            rel = Path(os_path).resolve().relative_to(root).as_posix()
        except ValueError:
            return  # not in the workspace
        if in_reserved(rel) or rel.startswith(".ipynb_checkpoints/") or "/.ipynb_checkpoints/" in rel:
            return
        why = outbound_reason(root, rel)  # the outbound gate: a file the user keeps out is never read to be sent
        if why is not None:
            log.info("jupyter-portable: %s was not forwarded to the worker: %s", rel, why)
            return
        orch = self.orchestrator()
        lc = orch.lifecycle()
        if lc.state != L.ACTIVE:
            return  # no worker: the edit stays here and goes to the next worker with the next Continue
        data = Path(os_path).read_bytes()
        # what this worker holds as far as this side knows: agreed with it, else the version it stands
        # on; never what was agreed with the machine before it (issue 43: every save after a Continue
        # was then a conflict of the notebook with itself)
        self.synced.switch(lc.allocation_id)
        base = self.synced.get(rel) or self._published_hash(rel)
        try:
            client = orch.client()
            client.put_file(rel, data, base)
            self.synced[rel] = digest(data)
            resolve_conflicts(self.ws.copy, rel)  # both sides hold this save now: nothing is in conflict
        except ConflictError:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            kept = f"{rel}.conflict-lab-{stamp}"
            with contextlib.suppress(PortableError):
                orch.client().put_file(kept, data, None)
            add_conflict(self.ws.copy, rel, now_iso("seconds"), kept)
            self.notice("conflict", f"{rel} changed on the worker too: the worker's version was kept, yours "
                                    f"is saved there as {kept}")
        except PortableError as exc:
            log.warning("jupyter-portable: %s was not forwarded to the worker: %s", rel, exc.one_line())

    @property
    def conflicts(self) -> list[dict[str, Any]]:
        """Files edited on both sides (kept in the copy, so a restarted server still shows them)."""
        return read_conflicts(self.ws.copy) if self.ws is not None else []

    def state(self) -> dict[str, Any]:
        """What the sidebar shows (docs/api.md, "State"); never calls a provider."""
        assert self.view is not None and self.idle is not None
        out = self.view.state(continuing=self.is_continuing(), conflicts=self.conflicts)
        return {**out, "idle": self.idle.view(self.orchestrator().lifecycle())}

    def _published_hash(self, rel: str) -> str | None:
        assert self.ws is not None
        lc = self.orchestrator().lifecycle()
        with contextlib.suppress(PortableError):
            m = self.ws.store.read_manifest(self.ws.workspace_id, lc.version or None)
            e = m.by_path().get(rel)
            return e.hash if e is not None else None
        return None


def find_workspace(root_dir: str, workspace: str | None = None) -> Workspace | None:
    """The workspace the server serves: ``workspace`` (c.Portable.workspace), else as this process's
    configuration or ``$JUPYTER_PORTABLE_WORKSPACE`` names it, else the one holding ``root_dir``.
    None where there is none (or the setting is bad: reading c.Portable says so)."""
    with contextlib.suppress(PortableError):
        return Workspace.find(workspace or PortableRun.current().workspace or root_dir)
    return None


__all__ = ["CHANGED_SCHEMA", "NOTICE_SCHEMA", "PROGRESS_SCHEMA", "SCHEMAS", "STATE_SCHEMA", "PortableService",
           "find_workspace", "service_for"]
