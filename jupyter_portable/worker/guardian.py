"""The guardian: the worker's thread that looks after its machine while the user side is away
(``core/guardian`` decides; this module looks, seals and ends the billing).

Every request of the user side (its monitor's ``/status``, a kernel's traffic, a save) tells the
worker it is there (:meth:`Guardian.heard`). Past the policy's grace without one, and once the run is
idle for the idle window or the money left is spent, the guardian seals (the final version published
and read back, :func:`.agent.seal`), records why in the workspace's allocation history
(``released_by``: what the user side shows when it comes back), and only then ends the machine's
billing by its provider's own means (invariant 6):

- ``pod-key``: RunPod's pod-scoped key (``RUNPOD_API_KEY``, with ``RUNPOD_POD_ID``), which may act on
  its own pod only: ``POST /v2/pods/{id}/action {"action": "stop"}``;
- ``instance-key``: a Vast.ai instance's own key (``CONTAINER_API_KEY``, with ``CONTAINER_ID``):
  ``PUT /api/v0/instances/{id}/ {"state": "stopped"}``;
- ``shutdown`` / ``shutdown-terminate``: ``shutdown -h now`` from the machine (found on the worker's PATH,
  else in :data:`SBIN`; through ``sudo -n`` for a login user that is not root, such as the AWS images'
  ``ubuntu``); an AWS instance launched with ``InstanceInitiatedShutdownBehavior=terminate`` terminates,
  a GCP VM stops.

The key is read where the provider puts it: the worker's start (``--detach``) finds it in its session's
environment or in the container's first process's (where Vast keeps it) and hands it to the agent over
stdin, never through an environment the kernel inherits; it is never logged, sent in ``/status`` or
written to the store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jupyter_portable.core import guardian as G
from jupyter_portable.core.errors import PortableError, UsageError
from jupyter_portable.core.idle import activity_from_status
from jupyter_portable.core.times import to_iso

log = logging.getLogger("jupyter_portable.worker")

TICK_S = 0.5
RETRY_S = 60.0  # after a release that failed (the store did not answer): the next try
# where each provider puts a machine's own key and its id (the key first)
KEY_NAMES = {G.POD_KEY: ("RUNPOD_API_KEY", "RUNPOD_POD_ID"), G.INSTANCE_KEY: ("CONTAINER_API_KEY", "CONTAINER_ID")}
DEFAULT_API = {G.POD_KEY: "https://api.runpod.io", G.INSTANCE_KEY: "https://console.vast.ai"}
# where an image keeps `shutdown` when the worker's PATH lacks it (a login user's PATH on Debian has no sbin)
SBIN = "/usr/sbin:/sbin"


def find_machine_key(means: str | None, environ: Mapping[str, str], first_process: Path = Path("/proc/1/environ")
                     ) -> dict[str, str] | None:
    """``{"key", "id"}`` of the machine's own key for ``means``, from ``environ`` or else the environment
    of the machine's first process (a container's entry point: Vast keeps its instance key there, and an
    SSH session does not inherit it); None where neither has both."""
    names = KEY_NAMES.get(means or "")
    if names is None:
        return None
    found = {n: environ.get(n) for n in names}
    if not all(found.values()):
        with contextlib.suppress(OSError):
            for item in first_process.read_bytes().split(b"\0"):
                name, _, value = item.decode(errors="replace").partition("=")
                if name in names and value and not found.get(name):
                    found[name] = value
    key, ident = found[names[0]], found[names[1]]
    return {"key": key, "id": ident} if key and ident else None


def check_machine_key(obj: object) -> dict[str, str]:
    if not isinstance(obj, dict) or set(obj) != {"key", "id"} or not all(
            isinstance(v, str) and v and len(v) < 512 for v in obj.values()):
        raise UsageError("machine_key must be {key, id}")
    return obj


class Guardian:
    """One per worker: heard from the user side, decides each tick, releases once."""

    def __init__(self, state: Any, policy: G.GuardianPolicy, machine_key: dict[str, str] | None, *,
                 clock: Callable[[], float] = time.time, run: Callable[..., Any] = subprocess.run) -> None:
        self.state = state
        self.policy = policy
        self._key = machine_key
        self.clock = clock
        self._run = run
        self.started = clock()
        self.user_seen: float | None = None
        self.decision: G.GuardianDecision | None = None
        self.released: dict[str, Any] | None = None
        self.failed: str | None = None  # why the last release did not happen (shown in /status)
        self._retry_at = 0.0
        self._lock = threading.Lock()

    def heard(self) -> None:
        """The user side asked something: it is there."""
        self.user_seen = self.clock()

    def view(self) -> dict[str, Any]:
        """``/status``'s ``guardian``: the policy (no key), whether the means is at hand, the last decision."""
        return {"policy": self.policy.to_json(), "key": self._key is not None if self.policy.means in KEY_NAMES
                else None, "decision": self.decision.to_json() if self.decision else None,
                "released": self.released, "failed": self.failed}

    def tick(self) -> G.GuardianDecision:
        now = self.clock()
        status = {"activity": self.state.activity.to_json()} if self.state.phase == "ready" else {}
        means = self.policy.means if (self.policy.means not in KEY_NAMES or self._key is not None) else None
        policy = self.policy if means == self.policy.means else dataclasses.replace(self.policy, means=None)
        d = G.decide(policy, now=_dt(now), started=_dt(self.started),
                     user_seen=_dt(self.user_seen) if self.user_seen is not None else None,
                     activity=activity_from_status(status))
        self.decision = d
        ready = self.state.accepting or self.state.sealed is not None  # not while a seal of the user side runs
        if d.state == G.STOP and self.released is None and ready and now >= self._retry_at:
            with self._lock:
                if self.released is None:
                    self._try_release(d, now)
        return d

    def _try_release(self, d: G.GuardianDecision, now: float) -> None:
        try:
            self.release(d)
        except Exception as exc:  # noqa: BLE001 - the machine stays as it was, its writes open again
            self.failed = exc.one_line() if isinstance(exc, PortableError) else f"{type(exc).__name__}: {exc}"
            log.error("guardian: the release failed, nothing was stopped: %s", self.failed)
            if self.state.sealed is None:  # not sealed: the worker takes writes again
                self.state.accepting = True
                self.state.phase = "ready"
            self._retry_at = now + RETRY_S  # and tries again later (a sealed one: the record and the stop)

    def loop(self) -> None:
        while self.released is None:
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - the guardian must outlive one bad look; said in the log
                log.error("guardian: %s", exc.one_line() if isinstance(exc, PortableError) else exc)
            time.sleep(TICK_S)

    # -- the release -------------------------------------------------------------------------------

    def release(self, d: G.GuardianDecision) -> None:
        """Seal, record why, end the billing (in that order: invariant 6)."""
        from jupyter_portable.worker.agent import seal

        why = "the budget ran out" if d.reason == "budget" else f"{self.policy.idle_minutes:g} min idle"
        log.warning("guardian: the user side has been away since %s and %s: sealing and releasing",
                    to_iso(d.absent_since) if d.absent_since else "?", why)
        sealed = self.state.sealed or seal(self.state, f"sealed by the machine: {why} while the user side was away")
        at = _dt(self.clock())
        record = G.release_record(d, self.policy, at=at, version=int(sealed["version"]))
        self._record(record, at)
        self.released = record
        error = self._end_billing()
        if error is not None:
            log.error("guardian: the machine could not end its own billing: %s", error)
            self.released = {**record, "error": error}
            self._record(self.released, at)

    def _record(self, release: dict[str, Any], at: datetime) -> None:
        from jupyter_portable.engine.workspace import Workspace
        from jupyter_portable.workdir.workcopy import WorkspaceCopy

        ws = Workspace(WorkspaceCopy(self.state.workdir))
        top, _ = ws.store.read_head(ws.workspace_id)
        head = ws.store.read_manifest(ws.workspace_id, top.version) if top.version else None
        rec = next((dict(a) for a in reversed(head.allocations if head else ())
                    if a.get("allocation_id") == self.state.allocation_id), {"allocation_id": self.state.allocation_id})
        if not release.get("error"):
            rec.update(state="released", stopped=to_iso(at),
                       stop_reason=f"released by the machine ({release['reason']})")
        rec["released_by"] = release
        ws.record_allocation(rec, f"allocation {self.state.allocation_id}: released by the machine "
                                  f"({release['reason']}), sealed as version {release['version']}")

    def _end_billing(self) -> str | None:
        """The provider's own means; None when the call was made and accepted, else why not (never the key)."""
        means = self.policy.means
        try:
            if means in (G.SHUTDOWN_STOP, G.SHUTDOWN_TERMINATE):
                return self._shutdown()
            if means in KEY_NAMES and self._key is not None:
                base = (self.policy.api_url or DEFAULT_API[means]).rstrip("/")
                ident = urllib.parse.quote(self._key["id"], safe="")
                if means == G.POD_KEY:
                    return self._call("POST", f"{base}/v2/pods/{ident}/action", {"action": "stop"})
                return self._call("PUT", f"{base}/api/v0/instances/{ident}/", {"state": "stopped"})
        except OSError as exc:
            return f"{type(exc).__name__}: {exc.strerror or exc}"
        return f"no means to end the billing ({means})"

    def _call(self, method: str, url: str, body: dict[str, Any]) -> str | None:
        assert self._key is not None
        req = urllib.request.Request(url, data=json.dumps(body).encode(), method=method, headers={
            "Authorization": f"Bearer {self._key['key']}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as reply:  # noqa: S310 - the provider's https API
                reply.read()
            return None
        except urllib.error.HTTPError as exc:
            return f"the provider answered HTTP {exc.code} to {method} {url}"

    def _shutdown(self) -> str | None:
        exe = shutil.which("shutdown") or shutil.which("shutdown", path=SBIN)
        if exe is None:
            return f"no shutdown command on this machine (looked on PATH and in {SBIN})"
        argv = [exe, "-h", "now"] if os.geteuid() == 0 else ["sudo", "-n", exe, "-h", "now"]
        done = self._run(argv, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            return f"{' '.join(argv[:-2])} failed: {(done.stderr or done.stdout or '').strip()[-300:]}"
        return None


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc)


def start_guardian(state: Any, config: dict[str, Any]) -> Guardian | None:
    """The guardian of this worker's configuration (None without a ``guardian`` policy), its thread started."""
    if config.get("guardian") is None:
        return None
    guardian = Guardian(state, G.GuardianPolicy.from_json(config["guardian"]), config.get("machine_key"))
    threading.Thread(target=guardian.loop, daemon=True, name="guardian").start()
    return guardian


__all__ = ["Guardian", "check_machine_key", "find_machine_key", "start_guardian"]
