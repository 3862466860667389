"""What the Continue, Stop and Loss protocols share: the persisted state moves, the worker's
clients, the one-at-a-time lock, the store credentials a worker is handed, and the summary.

The protocols themselves build on :class:`ProtocolBase`, each in its own module
(``allocation_close``, ``loss``, ``sealing``, ``continuing``); :class:`.orchestrator.Orchestrator`
is all of them together.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from jupyter_portable.compute.base import Allocation, AllocationStatus, Provider
from jupyter_portable.core import hooks
from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.envconfig import (
    PortableRun,
    boot_timeouts,
)
from jupyter_portable.core.errors import PortableError, ProviderUnavailable, UsageError
from jupyter_portable.core.secretenv import pass_names
from jupyter_portable.core.times import now_iso, parse_iso, utcnow
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.workdir import lifecycle_file as lifecycle_store
from jupyter_portable.worker.client import (
    AgentClient,
    AgentRecord,
    forget_record,
    load_allocation,
    load_record,
)

StateSink = Callable[[dict[str, Any]], None]
ProgressSink = Callable[[dict[str, Any]], None]
Reconnect = Callable[[AgentRecord], None]


class Cancelled(PortableError):
    """The user cancelled the Continue."""


class ProtocolBase:
    """The state, clients and settings of one workspace copy's orchestration (the user's side)."""

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
        # what each machine's worker last said of itself (its /status), as the loss check heard it:
        # the state view reads the checkpoints in flight there (a machine's answer: checked before shown)
        self.heard: dict[str, dict[str, Any]] = {}
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
                              "interpreter": (allocation.details.get("bootstrap") or {}).get("interpreter"),
                              # a machine that ends by itself (a Slurm job's walltime), and the one queued
                              # ahead to take over (orchestration/walltime.py)
                              "ends_at": allocation.details.get("ends_at"),
                              "next": (allocation.details.get("next") or {}).get("ref")}
            out["environment"] = allocation.details.get("environment_built")
        return out

    def _drop_client(self, allocation_id: str) -> None:
        c = self._clients.pop(allocation_id, None)
        if c is not None:
            c.close()
        forget_record(self.ws.copy, allocation_id)

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
