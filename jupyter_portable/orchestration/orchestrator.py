"""The Continue, Stop and Loss protocols, driving the persisted state machine.

``core.lifecycle`` says which moves are legal; this module makes them happen, in order,
on real machines, and records each one (``lifecycle_store``) before acting on it, so a
process killed at any point leaves a record that :meth:`Orchestrator.resume` can finish
or roll back. The CLI (``jupyter portable continue/stop``) and the server extension both
drive an :class:`Orchestrator`; the server adds a ``reconnect`` hook that restarts the
notebook's kernels on the new worker.

Who publishes what: the worker publishes the workspace's files (snapshots, checkpoints,
the seal) from its own copy. The orchestrator publishes only allocation records, with the
epoch it claimed for that allocation (``Workspace.record_allocation``): the failed attempts
and the new allocation before the worker materializes, a loss (after claiming a fresh
epoch, which fences the lost worker for good), and a release after the seal.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from typing import Any

from jupyter_portable.compute.base import Allocation, AllocationStatus, Provider
from jupyter_portable.core import hooks
from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.envconfig import (
    BOOT_TIMEOUT_ENV,
    DEFAULT_CLOUD_BOOT_TIMEOUT_S,
    ENVIRONMENT_MODES,
    PortableRun,
    boot_timeouts,
)
from jupyter_portable.core.errors import ComputeError, ConflictError, PortableError, ProviderUnavailable, UsageError
from jupyter_portable.core.secretenv import pass_names
from jupyter_portable.core.times import now_iso, parse_iso, parse_iso_or_none, utcnow
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.workdir import lifecycle_file as lifecycle_store
from jupyter_portable.worker.client import (
    AgentClient,
    AgentRecord,
    forget_record,
    load_allocation,
    load_record,
    save_allocation,
    save_record,
    start_agent,
)

StateSink = Callable[[dict[str, Any]], None]
ProgressSink = Callable[[dict[str, Any]], None]
Reconnect = Callable[[AgentRecord], None]

log = logging.getLogger("jupyter_portable.orchestration")
MATERIALIZE_TIMEOUT_S = 3600.0
# c.Portable.environment's modes, c.Portable.boot_timeout's parser: defined with their settings
# in core.envconfig.PortableRun, named here for the code that imports them from the orchestrator
ENVIRONMENT_ENV = "JUPYTER_PORTABLE_ENVIRONMENT"


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _environment_detail(built: Any, runtime: Any = None) -> dict[str, Any] | None:
    """What READY says of the kernel's environment: its mode, the Python, and each difference from the
    lockfile (issue 26: nothing is silently different)."""
    from jupyter_portable.core.envplan import EnvChange, differences, summary

    if not isinstance(built, dict):
        return None
    changes = []
    for raw in built.get("changes") or []:
        with contextlib.suppress(PortableError):
            changes.append(EnvChange.from_json(raw, "the worker's environment"))
    moved = (runtime or {}).get("python_changed") if isinstance(runtime, dict) else None
    python = None
    if isinstance(moved, dict) and isinstance(moved.get("recorded"), str) and isinstance(moved.get("installed"), str):
        python = {"recorded": moved["recorded"][:20], "installed": moved["installed"][:20]}
    text = summary(changes) if built.get("mode") == "lockfile" else "the machine's own Python"
    if python is not None:
        text = f"Python {python['recorded']} -> {python['installed']}; {text}"
    return {"mode": str(built.get("mode") or "image"), "kind": built.get("kind"), "env": built.get("env"),
            "python": python, "exact": not differences(changes) and python is None,
            "changes": [c.to_json() for c in changes],
            "summary": text}


class Cancelled(PortableError):
    """The user cancelled the Continue."""


class Orchestrator:
    """Continue, stop and loss for one workspace copy (the user's side, never the worker)."""

    def __init__(self, ws: Workspace, *, providers: dict[str, Provider] | None = None,
                 on_state: StateSink | None = None, on_progress: ProgressSink | None = None,
                 reconnect: Reconnect | None = None, lazy_threshold: int | None = None,
                 boot_timeout_s: float = 120, stale_after_s: float | None = None,
                 environment: dict[str, Any] | None = None, cloud_boot_timeout_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, pass_env: Iterable[str] | None = None,
                 boot_timeout: str | None = None, wall: Callable[[], datetime] = utcnow) -> None:
        self.ws = ws
        if pass_env is None or not environment or boot_timeout is None:
            # what the caller did not give: c.Portable's settings as this process's configuration and
            # the environment set them (core.envconfig.PortableRun, where they are read and checked)
            run = PortableRun.current()
            pass_env = run.pass_env if pass_env is None else pass_env
            environment = environment or {"mode": run.environment}
            boot_timeout = run.boot_timeout if boot_timeout is None else boot_timeout
        # the variables a worker gets on purpose, beyond core.secretenv's allow-list (c.Portable.pass_env)
        self.pass_env = pass_names(pass_env, "c.Portable.pass_env")
        self.environment = environment
        self._providers = providers
        self.on_state = on_state
        self.on_progress = on_progress
        self.reconnect = reconnect
        self.lazy_threshold = lazy_threshold
        self.boot_timeout_s = boot_timeout_s
        # a rented machine may take minutes to boot: c.Portable.boot_timeout says how many seconds,
        # for every cloud ("900") or per provider ("runpod=600,aws=1200,900")
        self.cloud_boot_timeouts = boot_timeouts(boot_timeout, cloud_boot_timeout_s, "c.Portable.boot_timeout")
        # how long no path may reach the active machine before it can be declared lost (and then only
        # while its provider cannot say it runs): c.Portable.unreachable_grace, core.reachability's rule
        self.unreachable_grace_s = (PortableRun.current().unreachable_grace if stale_after_s is None
                                    else float(stale_after_s))
        self.wall = wall  # the time of a loss check that is given none
        self.clock = clock  # heartbeat silence is measured on it, never on a clock read in the check
        self._cancel = threading.Event()
        # (allocation, when it stopped answering, what was last heard) while the active machine does not answer
        self._unreachable: tuple[str, datetime, str | None] | None = None
        self._clients: dict[str, AgentClient] = {}
        self._expirations: dict[str, str] = {}  # allocation -> when its store credentials expire
        # what each machine's provider last said, as the loss check saw it: the state view
        # reads spend from here, so showing the state never calls a provider
        self.observed: dict[str, AllocationStatus] = {}
        # issue 16 item 6 (estimates): per allocation, what its route predicted and when (on
        # ``clock``) its launch started and its machine came up; READY adds what was measured
        self._estimates: dict[str, dict[str, Any]] = {}

    # -- plumbing ---------------------------------------------------------------------------------

    @property
    def providers(self) -> dict[str, Provider]:
        if self._providers is None:
            from jupyter_portable.compute.registry import enabled_providers

            self._providers = enabled_providers()
        return self._providers

    def lifecycle(self) -> L.Lifecycle:
        return lifecycle_store.load(self.ws.copy)

    def _move(self, to: str, **kw: Any) -> L.Lifecycle:
        lc = lifecycle_store.update(self.ws.copy, lambda cur: L.transition(cur, to, at=now_iso(), **kw))
        hooks.entered_state(to)
        if self.on_state is not None:
            ev = lc.events[-1].to_json()
            self.on_state({"workspace_id": lc.workspace_id, **ev})
        return lc

    def _progress(self, step: str, message: str, done: float | None = None, total: float | None = None) -> None:
        if self.on_progress is not None:
            self.on_progress({"workspace_id": self.ws.workspace_id, "step": step, "message": message,
                              "done": done, "total": total})

    def provider_of(self, allocation: Allocation) -> Provider:
        provider = self.providers.get(allocation.provider)
        if provider is None:
            raise ProviderUnavailable(f"provider {allocation.provider!r} is not enabled here",
                                      provider=allocation.provider,
                                      hint="add it to JUPYTER_PORTABLE_PROVIDERS")
        return provider

    def record(self, allocation_id: str | None = None) -> AgentRecord | None:
        aid = allocation_id or self.lifecycle().allocation_id
        return load_record(self.ws.copy, aid) if aid else None

    def client(self, allocation_id: str | None = None) -> AgentClient:
        rec = self.record(allocation_id)
        if rec is None:
            raise UsageError("no worker serves this workspace now",
                             hint="`jupyter portable continue` starts one")
        cached = self._clients.get(rec.allocation_id)
        if cached is None or cached.record.token != rec.token:
            cached = AgentClient(rec, self.provider_of(rec.allocation))
            self._clients[rec.allocation_id] = cached
        return cached

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One Continue or Stop at a time per copy, across processes (the lock dies with its holder)."""
        with self.ws.copy.continue_lock(busy="a Continue or Stop of this workspace is already running",
                                        hint="wait for it, or cancel it"):
            yield

    def cancel(self) -> None:
        """Stop a running Continue at its next step (its machine is released)."""
        self._cancel.set()

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise Cancelled("cancelled by the user")

    def summary(self, lc: L.Lifecycle | None = None) -> dict[str, Any]:
        lc = lc or self.lifecycle()
        out: dict[str, Any] = {"state": lc.state, "allocation_id": lc.allocation_id, "route": lc.route,
                               "version": lc.version, "verified": lc.verified, "provider": None, "machine": None}
        allocation = load_allocation(self.ws.copy, lc.allocation_id) if lc.allocation_id else None
        if allocation is not None:
            out["provider"] = allocation.provider
            out["machine"] = {"ref": allocation.ref, "offer": allocation.offer_id,
                              "ssh": allocation.ssh.to_json() if allocation.ssh else None,
                              "host_key_fingerprint": allocation.details.get("host_key_fingerprint"),
                              "host_key_source": allocation.details.get("host_key_source"),
                              "python": allocation.details.get("python"),
                              "interpreter": (allocation.details.get("bootstrap") or {}).get("interpreter")}
            out["environment"] = allocation.details.get("environment_built")
        return out

    # -- Continue ---------------------------------------------------------------------------------

    def continue_(self, route_id: str | None = None, *, hours: float | None = None) -> dict[str, Any]:
        """Take the workspace to ACTIVE on a fresh, verified machine (the first one too)."""
        self._cancel.clear()
        with self._exclusive():
            lc = self.lifecycle()
            if lc.state == L.ACTIVE:
                self.check()
                lc = self.lifecycle()
                if lc.state == L.ACTIVE:
                    raise ConflictError(f"allocation {lc.allocation_id} is active and answering",
                                        hint="`jupyter portable stop` seals and releases it first")
            if lc.state not in L.CONTINUE_FROM:
                lc = self._resume_locked(lc)
                if lc.state == L.ACTIVE:
                    return self.summary(lc)
            if lc.state != L.ROUTING:
                self._move(L.ROUTING)
            return self._run(route_id, hours)

    def _ordered_routes(self, route_id: str | None, hours: float | None) -> list[Any]:
        from jupyter_portable.orchestration.routes import routes_to_try

        self._progress("acquire", "ranking routes")
        return routes_to_try(self.ws, route_id, hours=hours, providers=self.providers)

    def _run(self, route_id: str | None, hours: float | None) -> dict[str, Any]:
        from jupyter_portable.compute.acquire import acquire
        from jupyter_portable.orchestration.settings import load_settings

        store, wsid = self.ws.store, self.ws.workspace_id
        try:
            usable = self._ordered_routes(route_id, hours)
        except PortableError as exc:
            self._move(L.FAILED, reason=exc.one_line())
            raise
        by_key = {r.offer.key: r for r in usable}
        current: dict[str, Any] = {"route": None, "failure": None, "launch_at": None, "up_at": None}

        def new_allocation() -> str:
            self._check_cancel()
            epoch = store.claim_epoch(wsid)  # every writer of an older epoch is fenced from here on
            aid = f"al-{uuid.uuid4().hex[:12]}"
            # write-ahead: a restarted server knows which machine to look for
            self._move(L.ACQUIRING, route=current["route"], allocation_id=aid, epoch=epoch)
            return aid

        def on_event(ev: dict[str, Any]) -> None:
            st = ev["state"]
            route = by_key[ev["offer"]].id
            if st == "ACQUIRING":
                self._check_cancel()
                lc = self.lifecycle()
                current["route"] = route
                current["launch_at"], current["up_at"] = self.clock(), None  # estimates: this route's launch
                if lc.state == L.ROUTING:
                    self._move(L.ACQUIRING, route=route)
                else:
                    fail = current["failure"] or {}
                    self._move(L.ACQUIRING, route=route, attempts=[*lc.attempts, fail],
                               reason=f"failing over to {ev['offer']}: {fail.get('offer')} "
                                      f"{fail.get('stage')}: {fail.get('reason')}",
                               detail={"given_up": fail.get("offer"), "why": fail.get("reason")})
                self._progress("acquire", f"launching {ev['offer']}")
            elif st == "BOOTING":
                waited = int(ev.get("waited_s") or 0)
                self._progress("acquire", f"waiting for the machine ({waited // 60}:{waited % 60:02d}): "
                                          f"{ev.get('reason')}")
            elif st == "PROBING":
                current["up_at"] = self.clock()  # estimates: the machine is up
                # the acquire step's last word, shown once it is done: up, not "waiting ...: pending"
                up = int(max(0.0, current["up_at"] - (current["launch_at"] or current["up_at"])))
                self._progress("acquire", f"{ev['offer']} is up after {up // 60}:{up % 60:02d}")
                self._move(L.PROBING)
                self._progress("probe", f"checking image, GPU and driver on {ev.get('allocation_id')}")
            elif st in ("REFUSED", "FAILED"):
                current["failure"] = {"offer": ev["offer"], "stage": ev.get("stage"), "error": ev.get("error"),
                                      "reason": ev.get("reason"), "checks": ev.get("checks") or {},
                                      "environment_fault": bool(ev.get("environment_fault")),
                                      "allocation_id": ev.get("allocation_id")}
                self._progress("acquire", f"{ev['offer']} {st.lower()}: {ev.get('reason')}")

        def launched(allocation: Allocation) -> None:
            # the provider's machine id, recorded before the boot wait: a killed Continue can release it
            save_allocation(self.ws.copy, allocation)
            hooks.entered_state("LAUNCHED")

        settings = load_settings(self.ws)
        cloud = sorted({r.offer.provider for r in usable} - {"local", "ssh"})
        timeouts = self.cloud_boot_timeouts
        public_key = None
        if cloud:  # only a rented machine needs the user's key; made on first use (compute.keys)
            from jupyter_portable.compute.keys import user_key

            public_key = user_key().public
        try:
            allocation, attempts = acquire([r.offer for r in usable], self.providers, settings.requirements,
                                           allocation_id_factory=new_allocation, on_event=on_event,
                                           boot_timeout_s=self.boot_timeout_s,
                                           boot_timeouts={name: timeouts.get(name, timeouts["*"]) for name in cloud},
                                           ssh_public_key=public_key,
                                           launch_env={"JUPYTER_PORTABLE_WORKSPACE_ID": wsid},
                                           on_launched=launched)
        except (ComputeError, Cancelled) as exc:
            given_up = list(exc.context.get("attempts") or [])  # type: ignore[call-overload]
            lc = self.lifecycle()
            extra = [current["failure"]] if current["failure"] and current["failure"] not in lc.attempts else []
            self._publish_attempts(given_up)
            self._move(L.FAILED, reason=exc.one_line(), attempts=[*lc.attempts, *extra])
            raise
        except BaseException as exc:
            lc = self.lifecycle()
            if lc.state in L.CONTINUE_STATES:
                self._move(L.FAILED, reason=f"the Continue stopped: {type(exc).__name__}: {exc}")
            raise
        route = by_key[f"{allocation.provider}/{allocation.offer_id}"]
        if current["launch_at"] is not None:  # estimates: what the route said, timed from its launch
            self._estimates[allocation.allocation_id] = {"predicted": route.predicted(),
                                                         "launch_at": current["launch_at"],
                                                         "up_at": current["up_at"]}
        return self._materialize(allocation, route, attempts)

    def _publish_attempts(self, attempts: list[Any]) -> None:
        from jupyter_portable.orchestration.routes import record_attempt

        if not attempts:
            return
        epoch = self.ws.store.claim_epoch(self.ws.workspace_id)
        for a in attempts:
            with contextlib.suppress(PortableError):
                record_attempt(self.ws, a, epoch=epoch)

    def _materialize(self, allocation: Allocation, route: Any, attempts: list[Any]) -> dict[str, Any]:
        from jupyter_portable.orchestration.routes import record_attempt

        lc = self.lifecycle()
        epoch = lc.epoch
        save_allocation(self.ws.copy, allocation)
        try:
            for a in attempts:
                record_attempt(self.ws, a, epoch=epoch)
            offer = route.offer
            version = self.ws.record_allocation(
                {"allocation_id": allocation.allocation_id, "provider": allocation.provider,
                 "offer": allocation.offer_id, "gpu": offer.gpu, "region": offer.region, "ref": allocation.ref,
                 "driver": offer.driver,
                 "price_per_hour": offer.price_per_hour, "started": allocation.started or now_iso(),
                 # launched into a booking the provider sold: its spend is part of that booking's price
                 "reservation_id": allocation.details.get("capacity_reservation_id"),
                 "state": "active", "spend": 0.0, "currency": "USD", "failures": [a.reason for a in attempts],
                 "predicted": route.predicted()},  # estimates: what the route said (issue 16 item 6)
                epoch=epoch)
            self._move(L.MATERIALIZING, version=version)
            return self._start_worker(allocation, version, epoch)
        except BaseException as exc:
            self._fail_with_release(allocation, exc)
            raise

    def _start_worker(self, allocation: Allocation, version: int, epoch: int) -> dict[str, Any]:
        from jupyter_portable.orchestration.settings import load_settings

        self._progress("materialize", f"starting the worker on {allocation.allocation_id}")
        rec = start_agent(self.provider_of(allocation), allocation, store=self.ws.config.store,
                          workspace_id=self.ws.workspace_id, version=version, epoch=epoch,
                          lazy_threshold=self.lazy_threshold, environment=self.environment,
                          autosnapshot_minutes=load_settings(self.ws).autosnapshot_minutes,
                          progress=lambda line: self._progress("materialize", line), pass_env=self.pass_env)
        save_allocation(self.ws.copy, allocation)  # with what the start learnt: the worker's Python
        save_record(self.ws.copy, rec)
        return self._await_ready(rec)

    def _await_ready(self, rec: AgentRecord) -> dict[str, Any]:
        client = self.client(rec.allocation_id)
        seen: dict[str, Any] = {"verifying": False, "last": None}

        def on_status(st: dict[str, Any]) -> None:
            self._check_cancel()
            self._refresh_if_due(client, st, utcnow())  # a long materialization outlives one session
            prog = st.get("progress") or {}
            if prog.get("message") and prog != seen["last"]:
                seen["last"] = prog
                self._progress("materialize", str(prog["message"]))
            if st["phase"] in ("verifying", "ready") and not seen["verifying"]:
                seen["verifying"] = True
                self._move(L.VERIFYING)

        st = client.wait(lambda s: s["phase"] in ("ready", "failed"), timeout=MATERIALIZE_TIMEOUT_S,
                         on_status=on_status)
        if st["phase"] == "failed":
            raise PortableError(f"the worker could not get ready: {st.get('error')}")
        if not seen["verifying"]:
            self._move(L.VERIFYING)
        verification = st["verification"] or {}
        detail: dict[str, Any] = {"matched": list(verification.get("matched") or []),
                                  "checkpoints": verification.get("checkpoints") or {},
                                  # verified checkpoints whose files a later version changed
                                  "superseded": verification.get("superseded") or {},
                                  "pending": verification.get("pending") or [],
                                  "path": verification.get("path")}
        environment = _environment_detail(st.get("environment"), verification.get("runtime"))
        if environment is not None:
            detail["environment"] = environment
            rec.allocation.details["environment_built"] = environment
            save_allocation(self.ws.copy, rec.allocation)
        estimate = self._measure(rec.allocation_id, st.get("timings") or {})
        if estimate is not None:  # estimates: kept with READY until the record closes (_close_record)
            detail["estimate"] = estimate
        lc = self._move(L.READY, verified=True, version=int(verification["version"]), detail=detail)
        self._progress("verify", f"read back version {lc.version}: version, checkpoints, runtime and path match")
        return self._activate(rec)

    def _measure(self, allocation_id: str, timings: dict[str, Any]) -> dict[str, Any] | None:
        """What the route predicted and what happened, at READY: launch to Ready and to the machine
        being up on ``clock``, the transfer and the rest as the worker timed them. None when this
        process did not see the launch (a Continue resumed after a restart)."""
        marks = self._estimates.pop(allocation_id, None)
        if marks is None:
            return None
        ready = max(0.0, self.clock() - marks["launch_at"])
        measured: dict[str, float] = {"time_to_ready_s": round(ready, 3)}
        if marks["up_at"] is not None:
            measured["up_s"] = round(max(0.0, marks["up_at"] - marks["launch_at"]), 3)
        for key, name in (("materialize_s", "transfer_s"), ("environment_s", "environment_s"),
                          ("verify_s", "verify_s")):
            value = timings.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e9:
                measured[name] = round(float(value), 3)
        # boot, as the route model means it: everything of launch to Ready but the transfer
        measured["boot_s"] = round(max(0.0, ready - measured.get("transfer_s", 0.0)), 3)
        return {"predicted": marks["predicted"], "measured": measured}

    def _activate(self, rec: AgentRecord) -> dict[str, Any]:
        self._progress("reconnect", "restarting the notebook's kernel on the new worker")
        if self.reconnect is not None:
            try:
                self.reconnect(rec)
            except Exception as exc:
                self._fail_with_release(rec.allocation, exc)
                raise
        lc = self._move(L.ACTIVE)
        return self.summary(lc)

    def _fail_with_release(self, allocation: Allocation, exc: BaseException) -> None:
        """A Continue that cannot reach READY (or ACTIVE): release its machine, then FAILED."""
        reason = exc.one_line() if isinstance(exc, PortableError) else f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            self.client(allocation.allocation_id).shutdown()
        released = True
        try:
            self.provider_of(allocation).terminate(allocation)
        except PortableError as term:
            released = False
            reason += f" (releasing {allocation.allocation_id} failed: {term})"
        self._drop_client(allocation.allocation_id)
        lc = self.lifecycle()
        if lc.state in L.CONTINUE_STATES:
            self._move(L.FAILED, reason=reason, detail={"released": released})
        with contextlib.suppress(PortableError):
            epoch = self.ws.store.claim_epoch(self.ws.workspace_id)
            prior: dict[str, Any] = next((x for x in reversed(self._history())
                                          if x.get("allocation_id") == allocation.allocation_id), {})
            spend, source = self._settle(allocation, price_per_hour=prior.get("price_per_hour"),
                                         started=prior.get("started") or allocation.started)  # it ran: it is paid
            self.ws.record_allocation({"allocation_id": allocation.allocation_id,
                                       "provider": allocation.provider, "offer": allocation.offer_id,
                                       "ref": allocation.ref, "started": allocation.started or now_iso(),
                                       "stopped": now_iso(), "state": "failed", "stop_reason": reason[:500],
                                       "spend": round(spend, 6), "spend_source": source,
                                       "currency": "USD", "failures": [reason[:500]]}, epoch=epoch)

    def _drop_client(self, allocation_id: str) -> None:
        c = self._clients.pop(allocation_id, None)
        if c is not None:
            c.close()
        forget_record(self.ws.copy, allocation_id)

    # -- Stop (seal) ------------------------------------------------------------------------------

    def stop(self, reason: str = "stopped by the user", *, detail: dict[str, Any] | None = None,
             allocation_id: str | None = None) -> dict[str, Any]:
        """Seal, read back, release: the allocation ends with nothing unpublished. ``detail`` goes
        with the DRAINING event; ``allocation_id``, when given, must be the one still serving."""
        with self._exclusive():
            lc = self.lifecycle()
            if lc.state not in (L.ACTIVE, L.DRAINING, L.SEALED):
                raise UsageError(f"nothing to stop: the workspace is {lc.state}")
            if allocation_id is not None and lc.allocation_id != allocation_id:
                raise ConflictError(f"{allocation_id} no longer serves the workspace ({lc.allocation_id} does)")
            return self._stop_locked(lc, reason, detail)

    def _stop_locked(self, lc: L.Lifecycle, reason: str, detail: dict[str, Any] | None = None) -> dict[str, Any]:
        rec = self.record(lc.allocation_id)
        if lc.state == L.ACTIVE:
            lc = self._move(L.DRAINING, reason=reason, detail=detail)
        if lc.state == L.DRAINING:
            self._progress("seal", "no new writes; publishing the final version")
            try:
                if rec is None:
                    raise PortableError(f"no record of how to reach the worker of {lc.allocation_id}")
                sealed = self.client(rec.allocation_id).seal(f"sealed: {reason}")
            except ProviderUnavailable as exc:
                # the worker did not answer: lost only on evidence (core.reachability), that is when
                # its provider says the machine is gone; else it is unreachable, and nothing is released
                if rec is not None and self._provider_says_gone(rec):
                    self._lost(lc, f"lost while sealing: {exc}")
                    raise
                stale = self._clients.pop(lc.allocation_id or "", None)  # the next try connects afresh
                if stale is not None:
                    stale.close()
                self._move(L.ACTIVE, reason=f"the seal failed, the machine does not answer (nothing was "
                                            f"released; stop again when it answers): {exc.one_line()}")
                raise
            except PortableError as exc:
                self._move(L.ACTIVE, reason=f"the seal failed, writes are open again: {exc.one_line()}")
                raise
            lc = self._move(L.SEALED, version=int(sealed["version"]))
        spend = 0.0
        if rec is not None:
            provider = self.provider_of(rec.allocation)
            seen = self.observed.get(rec.allocation_id)  # the provider's last figure, should it not answer now
            spend = float(seen.spend or 0.0) if seen is not None else 0.0
            with contextlib.suppress(PortableError):
                spend = float(provider.status(rec.allocation).spend or spend)
            with contextlib.suppress(PortableError):
                self.client(rec.allocation_id).shutdown()  # the agent goes first, then its machine
            provider.terminate(rec.allocation)  # only after SEALED (invariant 6)
        lc = self._move(L.RELEASED)
        if rec is not None:
            self._close_record(rec, state="released", reason=reason, spend=spend, epoch=lc.epoch)
            self._drop_client(rec.allocation_id)
        self._adopt_head()
        return {**self.summary(lc), "sealed_version": lc.version}

    def _adopt_head(self) -> None:
        """The file browser pulled the machine's files into this copy while it ran (orchestration/follow):
        when the copy now holds exactly the head's files, it is on the head, so `verify` and the next
        snapshot start from there. A copy with edits of its own stays on its version."""
        with contextlib.suppress(PortableError):
            head, _ = self.ws.store.read_head(self.ws.workspace_id)
            cfg = self.ws.copy.read_config()
            if head.version > cfg.version and self.ws.verify(version=head.version).ok:
                cfg.version = head.version
                self.ws.copy.write_config(cfg)

    def _close_record(self, rec: AgentRecord, *, state: str, reason: str, spend: float, epoch: int,
                      failures: list[str] | None = None) -> None:
        a = rec.allocation
        mine = [x for x in self._history() if x.get("allocation_id") == a.allocation_id]
        prior: dict[str, Any] = mine[-1] if mine else {}
        # the bill where the provider has one, else the last figure seen (``spend``), else an estimate
        seen = self.observed.get(a.allocation_id)
        spend, source = self._settle(a, price_per_hour=prior.get("price_per_hour"),
                                     started=prior.get("started") or a.started,
                                     seen=(spend, seen.spend_source if seen is not None else None))
        record = {**prior, "allocation_id": a.allocation_id, "provider": a.provider, "offer": a.offer_id,
                  "ref": a.ref, "started": prior.get("started") or a.started or now_iso(), "stopped": now_iso(),
                  "state": state, "stop_reason": reason[:500], "spend": round(spend, 6), "spend_source": source,
                  "currency": "USD", "failures": list(prior.get("failures") or []) + list(failures or [])}
        measured = self._measured_at_close(a.allocation_id, record, spend)  # estimates
        if measured:
            record["measured"] = measured
        environment = self._environment_at_ready(a.allocation_id)
        if environment is not None:
            record["environment"] = environment
        with contextlib.suppress(PortableError):
            self.ws.record_allocation(record, epoch=epoch)

    def _settle(self, allocation: Allocation, *, price_per_hour: Any, started: str | None,
                seen: tuple[float | None, str | None] | None = None) -> tuple[float, str]:
        """What the allocation cost, with the figure's source (see :func:`.budget.settle`)."""
        from jupyter_portable.orchestration.budget import settle

        provider = None
        with contextlib.suppress(PortableError):
            provider = self.provider_of(allocation)
        price = price_per_hour if isinstance(price_per_hour, (int, float)) else allocation.details.get("price_per_hour")
        return settle(provider, allocation, until=utcnow(), started=started, seen=seen,
                      price_per_hour=float(price) if isinstance(price, (int, float)) else None)

    def _environment_at_ready(self, allocation_id: str) -> dict[str, Any] | None:
        """The environment READY reported for this allocation, as the machine history keeps it."""
        from jupyter_portable.core.envplan import check_record, record

        for ev in reversed(self.lifecycle().events):
            env = (ev.detail or {}).get("environment") if ev.state == L.READY else None
            if ev.allocation_id == allocation_id and isinstance(env, dict):
                with contextlib.suppress(PortableError):
                    return check_record(record(env), allocation_id)
        return None

    def _measured_at_close(self, allocation_id: str, record: dict[str, Any], spend: float) -> dict[str, Any]:
        """READY's measurement of this allocation (from the lifecycle, which outlives a restart),
        with what it cost: spend, hours held, and that rate for the planned hours."""
        measured: dict[str, Any] = dict(record.get("measured") or {})
        for ev in self.lifecycle().events:
            estimate = (ev.detail or {}).get("estimate") if ev.state == L.READY else None
            if ev.allocation_id == allocation_id and isinstance(estimate, dict):
                measured.update(estimate.get("measured") or {})
        if not measured:
            return {}
        t0, t1 = parse_iso_or_none(record.get("started")), parse_iso_or_none(record.get("stopped"))
        hours = max(0.0, (t1 - t0).total_seconds() / 3600) if t0 and t1 else 0.0
        planned = (record.get("predicted") or {}).get("hours")
        measured.update(spend=round(spend, 6), hours=round(hours, 6))
        if hours > 0 and isinstance(planned, (int, float)):
            measured["cost"] = round(spend / hours * planned, 6)
        return measured

    def _history(self) -> list[dict[str, Any]]:
        head, _ = self.ws.store.read_head(self.ws.workspace_id)
        if not head.version:
            return []
        return list(self.ws.store.read_manifest(self.ws.workspace_id, head.version).allocations)

    def snapshot(self, message: str) -> dict[str, Any]:
        """Publish a version: from the worker while one is active (it holds the newest files),
        else from this copy."""
        if self.lifecycle().state == L.ACTIVE:
            return self.client().snapshot(message)
        res = self.ws.snapshot(message, progress=None)
        return {"version": res.version, "changed": res.changed, "skipped": list(res.to_json().get("skipped") or [])}

    # -- Loss -------------------------------------------------------------------------------------

    def check(self, now: datetime | float | None = None) -> dict[str, Any]:
        """Look at the active machine once: its provider's status and the agent's heartbeat, and
        decide by :func:`jupyter_portable.core.reachability.decide` (one rule for every provider):
        LOST (recorded, with the reason) only when the provider says the machine is gone, or no path
        has reached it for ``unreachable_grace_s`` while the provider cannot say it runs; until then
        it is unreachable (``"unreachable_since"`` in the answer), shown and left alone. ``now``: the
        time of this look (a datetime, or seconds since the epoch); None reads ``wall``."""
        from jupyter_portable.core import reachability as R

        if now is None:
            at = self.wall()
        elif isinstance(now, datetime):
            at = now
        else:
            at = datetime.fromtimestamp(float(now), timezone.utc)
        lc = self.lifecycle()
        if lc.state not in (L.ACTIVE, L.READY):
            self._unreachable = None
            return {**self.summary(lc), "alive": None, "unreachable_since": None}
        rec = self.record(lc.allocation_id)
        if rec is None:
            self._lost(lc, "no record of how to reach the worker is left on this machine")
            return {**self.summary(), "alive": False, "unreachable_since": None}
        status = None
        asked: str | None = None
        try:
            status = self.provider_of(rec.allocation).status(rec.allocation)
        except PortableError as exc:
            asked = exc.one_line()  # the provider did not answer: it cannot say
        if status is not None:
            self.observed[rec.allocation_id] = status
        if status is not None and status.state == "reachable":
            # a host-side restart may map SSH elsewhere (Vast): follow it, held to the pinned host key
            from jupyter_portable.compute.acquire import follow_endpoint

            try:
                if follow_endpoint(rec.allocation, status):
                    save_record(self.ws.copy, rec)
                    save_allocation(self.ws.copy, rec.allocation)
                    stale = self._clients.pop(rec.allocation_id, None)  # the next call connects there
                    if stale is not None:
                        stale.close()
            except ComputeError as exc:
                self._lost(lc, str(exc), spend=status.spend or 0.0)
                return {**self.summary(), "alive": False, "unreachable_since": None}
        answer = R.provider_answer(status.state if status is not None else None)
        said = (status.reason or (f"the provider says the machine is {status.state}" if answer == R.GONE else None)
                ) if status is not None else asked
        reached = False
        if answer != R.GONE:
            try:
                try:
                    self.client(rec.allocation_id).status(timeout=5)
                except PortableError:
                    # the user's address may have changed (another network): where the provider's firewall
                    # admits addresses, the new one is let in first, and the worker asked again
                    if not self._admit_caller(rec):
                        raise
                    self.client(rec.allocation_id).status(timeout=5)
                reached = True
            except PortableError as exc:
                said = f"{said}; heartbeat: {exc.one_line()}" if said else f"heartbeat: {exc.one_line()}"
                stale = self._clients.pop(rec.allocation_id, None)  # the next look connects afresh
                if stale is not None:
                    stale.close()
        since = self._unreachable[1] if self._unreachable and self._unreachable[0] == rec.allocation_id else None
        decision = R.decide(answer, reached=reached, since=since, now=at, grace_s=self.unreachable_grace_s,
                            said=said)
        if decision.verdict == R.LOST:
            self._unreachable = None
            self._lost(lc, decision.reason or "lost", spend=(status.spend or 0.0) if status else 0.0)
            return {**self.summary(), "alive": False, "unreachable_since": None}
        if decision.verdict == R.UNREACHABLE:
            if since is None:
                log.warning("%s: %s (%s); nothing is released while the provider may still run it",
                            rec.allocation_id, decision.line(), decision.reason)
            self._unreachable = (rec.allocation_id, decision.since or at, decision.reason)
            return {**self.summary(lc), "alive": False, "unreachable_since": _iso(decision.since),
                    "unreachable": decision.line(), "unreachable_reason": decision.reason}
        if since is not None:
            log.warning("%s answers again (%s); nothing was lost", rec.allocation_id,
                        R.Decision(R.UNREACHABLE, since).line())
        self._unreachable = None
        return {**self.summary(lc), "alive": True, "unreachable_since": None}

    def unreachable(self) -> dict[str, Any] | None:
        """The active machine that no path reaches, as the last check saw it (state.json ``unreachable``):
        ``{"allocation_id", "since", "line": "unreachable since 14:02Z", "reason"}``; None while it answers."""
        from jupyter_portable.core.reachability import UNREACHABLE, Decision

        held = self._unreachable
        lc = self.lifecycle()
        if held is None or held[0] != lc.allocation_id or lc.state not in (L.ACTIVE, L.READY):
            return None
        return {"allocation_id": held[0], "since": _iso(held[1]), "line": Decision(UNREACHABLE, held[1]).line(),
                "reason": (held[2] or "")[:1000] or None}

    def _provider_says_gone(self, rec: AgentRecord) -> bool:
        """Whether the allocation's provider says its machine is gone (a provider that does not answer
        cannot say so)."""
        from jupyter_portable.core import reachability as R

        try:
            status = self.provider_of(rec.allocation).status(rec.allocation)
        except PortableError:
            return False
        return R.provider_answer(status.state) == R.GONE

    def _admit_caller(self, rec: AgentRecord) -> bool:
        """Whether the provider had to let SSH in from this computer's address (then the worker's
        client connects afresh); a provider that cannot say is taken as no."""
        try:
            admitted = self.provider_of(rec.allocation).admit_caller(rec.allocation)
        except PortableError:
            return False
        if admitted:
            stale = self._clients.pop(rec.allocation_id, None)
            if stale is not None:
                stale.close()
        return admitted

    def _lost(self, lc: L.Lifecycle, reason: str, *, spend: float = 0.0) -> None:
        current = self.lifecycle()
        if current.state not in (L.ACTIVE, L.READY, L.DRAINING) or current.allocation_id != lc.allocation_id:
            return
        if current.state == L.READY:
            # never ACTIVE: the Continue that reached READY fails, its machine is gone
            self._move(L.FAILED, reason=f"lost before the kernel moved: {reason}")
        else:
            self._move(L.LOST, reason=reason)
        rec = self.record(lc.allocation_id)
        # a fresh epoch: the lost worker can never publish again, even if it comes back
        with contextlib.suppress(PortableError):
            epoch = self.ws.store.claim_epoch(self.ws.workspace_id)
            if rec is not None:
                self._close_record(rec, state="lost", reason=reason, spend=spend, epoch=epoch, failures=[reason])
        if rec is not None:
            with contextlib.suppress(PortableError):
                self.provider_of(rec.allocation).terminate(rec.allocation)
            self._drop_client(rec.allocation_id)

    # -- store credentials ------------------------------------------------------------------------

    def refresh_credentials(self, now: datetime | None = None) -> str | None:
        """Hand the active worker fresh store credentials when its own expire within
        ``REFRESH_MARGIN`` of ``now``; the new expiration, or None when nothing was due."""
        lc = self.lifecycle()
        if lc.state not in (L.MATERIALIZING, L.VERIFYING, L.READY, L.ACTIVE, L.DRAINING) or not lc.allocation_id:
            return None
        if self.record(lc.allocation_id) is None:
            return None
        client = self.client(lc.allocation_id)
        held = self._expirations.get(lc.allocation_id)
        if held is None:  # not known in this process yet (a restarted server): ask the worker once
            held = (client.status(timeout=5).get("credentials") or {}).get("expiration") or ""
            self._expirations[lc.allocation_id] = held
        return self._refresh_if_due(client, {"credentials": {"expiration": held}}, now or utcnow())

    def _refresh_if_due(self, client: AgentClient, status: dict[str, Any], now: datetime) -> str | None:
        from jupyter_portable.store.credentials import REFRESH_MARGIN, issue

        held = (status.get("credentials") or {}).get("expiration")
        if not held:  # a file:// store's worker holds none
            return None
        if parse_iso(held, "the worker's credentials expiration") - now > REFRESH_MARGIN:
            return None
        aid = client.record.allocation_id
        creds = issue(self.ws.config.store, self.ws.workspace_id, session_name=aid)
        if creds is None:
            return None
        expiration = str(client.put_credentials(creds)["expiration"])
        self._expirations[aid] = expiration
        return expiration

    # -- after a restart --------------------------------------------------------------------------

    def resume(self) -> dict[str, Any]:
        """What a restarted server does first: finish or roll back whatever was in flight."""
        with self._exclusive():
            lc = self._resume_locked(self.lifecycle())
            return self.summary(lc)

    def _resume_locked(self, lc: L.Lifecycle) -> L.Lifecycle:
        if lc.state in L.CONTINUE_FROM or lc.state == L.ACTIVE:
            return lc
        if lc.state in (L.DRAINING, L.SEALED):
            self._stop_locked(lc, "resumed after a restart")
            return self.lifecycle()
        new, _action = L.recover(lc, at=now_iso())
        if new is not lc:
            lc = lifecycle_store.update(self.ws.copy, lambda cur: L.recover(cur, at=now_iso())[0])
            if self.on_state is not None:
                self.on_state({"workspace_id": lc.workspace_id, **lc.events[-1].to_json()})
        if lc.state == L.ROUTING:
            orphan = (lc.events[-1].detail or {}).get("orphan")
            if orphan:
                self._terminate_orphan(str(orphan["allocation_id"]))
            return lc
        rec = self.record(lc.allocation_id)
        if lc.state == L.MATERIALIZING:
            allocation = rec.allocation if rec is not None else load_allocation(self.ws.copy, str(lc.allocation_id))
            if allocation is None:
                self._move(L.FAILED, reason="the server restarted before the machine was recorded; Continue again")
                self._terminate_orphan(str(lc.allocation_id))
                return self.lifecycle()
            try:
                if rec is not None and self._answers(rec):
                    self._await_ready(rec)
                else:  # the agent never started, or died with the server's restart: start it again
                    if rec is not None:
                        self._drop_client(rec.allocation_id)
                        save_allocation(self.ws.copy, allocation)
                    self._start_worker(allocation, lc.version, lc.epoch)
            except Exception as exc:
                self._fail_with_release(allocation, exc)
            return self.lifecycle()
        if lc.state == L.READY and rec is not None:
            try:
                self._activate(rec)
            except PortableError:
                pass
            return self.lifecycle()
        return lc

    def abandon(self, exc: BaseException) -> dict[str, Any]:
        """After a restart's resume failed: leave no Continue half-way that nothing drives.

        The machine the record names, if any, is released and the workspace goes to FAILED with
        the reason, so the sidebar offers Continue again. Another process holding the lock is
        finishing the Continue itself (a ConflictError): it is left alone."""
        with self._exclusive():
            lc = self.lifecycle()
            if lc.state not in L.CONTINUE_STATES:
                return self.summary(lc)
            allocation = load_allocation(self.ws.copy, lc.allocation_id) if lc.allocation_id else None
            if allocation is not None:
                self._fail_with_release(allocation, exc)
            else:
                if lc.allocation_id:  # killed before the launch answered: find it by its name
                    self._terminate_orphan(str(lc.allocation_id))
                reason = exc.one_line() if isinstance(exc, PortableError) else f"{type(exc).__name__}: {exc}"
                self._move(L.FAILED, reason=f"resuming after a restart failed: {reason}")
            return self.summary()

    def _answers(self, rec: AgentRecord) -> bool:
        try:
            self.client(rec.allocation_id).status(timeout=5)
            return True
        except PortableError:
            return False

    def _terminate_orphan(self, allocation_id: str) -> None:
        rec = self.record(allocation_id)
        allocation = rec.allocation if rec is not None else load_allocation(self.ws.copy, allocation_id)
        if allocation is None:
            local = self.providers.get("local")
            finder = getattr(local, "allocation", None)
            if finder is not None:
                with contextlib.suppress(PortableError):
                    allocation = finder(allocation_id)
        if allocation is None:  # killed before the launch answered: find it by its name (compute.base)
            from jupyter_portable.orchestration.machines import find_allocation

            allocation = find_allocation(self.providers, allocation_id)
        if allocation is not None:
            with contextlib.suppress(PortableError):
                self.provider_of(allocation).terminate(allocation)
            self._drop_client(allocation_id)


__all__ = ["BOOT_TIMEOUT_ENV", "DEFAULT_CLOUD_BOOT_TIMEOUT_S", "ENVIRONMENT_ENV", "ENVIRONMENT_MODES", "Cancelled",
           "Orchestrator", "boot_timeouts"]
