"""The Continue protocol: ROUTING -> ACQUIRING -> PROBING -> MATERIALIZING -> VERIFYING -> READY
-> ACTIVE, each move recorded before it is acted on; a Continue that cannot reach ACTIVE
releases its machine and records why (FAILED)."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

from jupyter_portable.compute.base import Allocation
from jupyter_portable.core import hooks
from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.errors import ComputeError, PortableError
from jupyter_portable.core.times import now_iso, utcnow
from jupyter_portable.orchestration.protocol_base import Cancelled
from jupyter_portable.orchestration.sealing import StopProtocol
from jupyter_portable.worker.client import (
    AgentRecord,
    save_allocation,
    save_record,
    start_agent,
)

MATERIALIZE_TIMEOUT_S = 3600.0


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


class ContinueProtocol(StopProtocol):
    """Routes in order, a launch with fail-over, the worker started, READY only on a read-back."""

    # the offer of a machine queued ahead that this Continue takes over (Orchestrator.continue_'s ``queued``)
    _queued: Any = None

    def _ordered_routes(self, route_id: str | None, hours: float | None) -> list[Any]:
        from jupyter_portable.orchestration.routes import routes_to_try

        queued, self._queued = self._queued, None
        if queued is not None and route_id is not None and queued.provider in self.providers:
            # the machine is already asked for (orchestration/walltime.py): its one route, no listing
            self._progress("acquire", f"taking over {queued.key}, queued ahead")
            return routes_to_try(self.ws, route_id, hours=hours, offers=[queued],
                                 providers={queued.provider: self.providers[queued.provider]})
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
            elif st == "WARNING":  # said before the machine is rented (a custom image's SSH, compute/acquire)
                self._progress("acquire", f"{ev['offer']}: warning: {ev.get('reason')}")
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
        return self._materialize(allocation, route, attempts, {k: r.offer for k, r in by_key.items()})

    def _publish_attempts(self, attempts: list[Any]) -> None:
        from jupyter_portable.orchestration.routes import record_attempt

        if not attempts:
            return
        epoch = self.ws.store.claim_epoch(self.ws.workspace_id)
        for a in attempts:
            with contextlib.suppress(PortableError):
                record_attempt(self.ws, a, epoch=epoch)

    def _materialize(self, allocation: Allocation, route: Any, attempts: list[Any],
                     offers: dict[str, Any] | None = None) -> dict[str, Any]:
        from jupyter_portable.orchestration.routes import record_attempt

        lc = self.lifecycle()
        epoch = lc.epoch
        save_allocation(self.ws.copy, allocation)
        try:
            for a in attempts:  # named as the routes named them: the notice says which one failed
                record_attempt(self.ws, a, epoch=epoch, offer=(offers or {}).get(a.offer_key))
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
        from jupyter_portable.orchestration.guardian import policy_for
        from jupyter_portable.orchestration.settings import load_settings

        self._progress("materialize", f"starting the worker on {allocation.allocation_id}")
        rec = start_agent(self.provider_of(allocation), allocation, store=self.ws.config.store,
                          workspace_id=self.ws.workspace_id, version=version, epoch=epoch,
                          lazy_threshold=self.lazy_threshold, environment=self.environment,
                          autosnapshot_minutes=load_settings(self.ws).autosnapshot_minutes,
                          progress=lambda line: self._progress("materialize", line), pass_env=self.pass_env,
                          guardian=policy_for(self.ws, allocation, self.provider_of(allocation)))
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
