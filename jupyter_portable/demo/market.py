"""The local market: a provider whose machines are worker processes on this computer.

It is the demo's default and a fault injector. A catalog (:mod:`.catalog`) lists offers
with capacity, boot time, launch failure rate and, where the listing lies, the driver the
machine really reports. Each allocation is a fresh folder ``<state_dir>/allocations/<id>/``
with ``bin/nvidia-smi`` presenting the offer's GPU and ``work/``, and a real worker process
(:mod:`jupyter_portable.compute.agent_stub`, the one an SSH host runs too) heartbeating into it.
``lose`` plays the market taking a machine back.

The market's state is one JSON file under an flock, written atomically, so the CLI, the
Jupyter server and the tests in different processes see one market.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jupyter_portable.compute.admission import IMAGE_ENV
from jupyter_portable.compute.base import Allocation, AllocationStatus, Provider, Reservation
from jupyter_portable.core.errors import LaunchFailed, NoCapacity, NotSupported, QuotaExceeded, UsageError
from jupyter_portable.core.offers import Offer, Requirements
from jupyter_portable.core.secretenv import scrubbed
from jupyter_portable.core.times import from_timestamp_iso, parse_iso
from jupyter_portable.demo.catalog import Catalog, default_catalog_path, load_catalog
from jupyter_portable.demo.fake_nvidia_smi import write_fake_nvidia_smi
from jupyter_portable.workdir.files import atomic_write, file_lock

MARKET_DIR_ENV = "JUPYTER_PORTABLE_MARKET_DIR"
SEED_ENV = "JUPYTER_PORTABLE_MARKET_SEED"  # c.PortableLocal.seed
STATE_VERSION = 1
LOST_BY_MARKET = "preempted by the market"
_ALLOCATION_ID = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
# Workers this process started. Polling them reaps them: a dead child that is never
# waited for stays a zombie, and a zombie still answers kill(pid, 0).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def default_market_dir() -> Path:
    """``$JUPYTER_PORTABLE_MARKET_DIR``, else ``<jupyter data dir>/portable/market`` (compute.config)."""
    from jupyter_portable.compute.config import PortableLocal

    return Path(PortableLocal().market_dir)


# --- the shared state file ---------------------------------------------------------------

class _State:
    """``market.json`` under ``market.lock``: read, change and write back in one critical section."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / "market.json"

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Any]]:
        """Yield the state; whatever the body changed is written back, even when it raises,
        because every change the market makes is complete before the next statement."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with file_lock(self.dir / "market.lock"):
            data = self._read()
            before = json.dumps(data, sort_keys=True)
            try:
                yield data
            finally:
                if json.dumps(data, sort_keys=True) != before:
                    self._write(data)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"version": STATE_VERSION, "launches": 0, "allocations": {}, "reservations": {}}
        except (OSError, ValueError) as exc:
            raise UsageError(f"local market state {self.path} cannot be read: {exc}",
                             hint="move it aside to start an empty market") from None
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise UsageError(f"local market state {self.path} is not version {STATE_VERSION}",
                             hint="move it aside to start an empty market")
        return data

    def _write(self, data: dict[str, Any]) -> None:
        atomic_write(self.path, json.dumps(data, indent=1, sort_keys=True).encode())


# --- worker processes --------------------------------------------------------------------

def _alive(pid: int, allocation_id: str) -> bool:
    """Whether the worker of ``allocation_id`` still runs as ``pid`` (a reused PID does not count)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): the PID alone has to do
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if stat.rpartition(")")[2].split()[:1] == ["Z"]:
        return False
    return allocation_id.encode() in cmdline.split(b"\0")


def _signal(pid: int, allocation_id: str, sig: int) -> None:
    """Signal the worker's whole process group (it leads one: kernels it starts go too)."""
    if _alive(pid, allocation_id):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def _wait_gone(pid: int, allocation_id: str, timeout: float) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout)
    deadline = time.monotonic() + timeout
    while _alive(pid, allocation_id):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _stop(pid: int, allocation_id: str, *, grace: float) -> None:
    """SIGTERM, then SIGKILL when the worker has not gone within ``grace`` seconds."""
    if grace > 0:
        _signal(pid, allocation_id, signal.SIGTERM)
        if _wait_gone(pid, allocation_id, grace):
            return
    _signal(pid, allocation_id, signal.SIGKILL)
    _wait_gone(pid, allocation_id, 5)


def lose_allocation(state_dir: str | os.PathLike[str], allocation_id: str, reason: str = LOST_BY_MARKET
                    ) -> dict[str, Any]:
    """The market takes ``allocation_id`` back: mark it lost with ``reason``, SIGKILL its worker.

    For ``jupyter portable market lose ALLOCATION``. Returns the allocation's record; raises
    UsageError when the market does not know it or it was already terminated.
    """
    state = _State(Path(state_dir))
    with state.locked() as data:
        rec = data["allocations"].get(allocation_id)
        if rec is None:
            raise UsageError(f"the local market at {state.dir} has no allocation {allocation_id!r}",
                             hint="`jupyter portable market list` lists them")
        if rec["state"] == "terminated":
            raise UsageError(f"allocation {allocation_id} was already terminated; there is nothing to lose")
        if rec["state"] == "active":
            # marked first, so nobody reads the dying worker as merely crashed
            rec.update(state="lost", stop_reason=reason, ended_at=time.time())
        record = dict(rec)
    _stop(record["pid"], allocation_id, grace=0)
    return record


# --- the provider --------------------------------------------------------------------------

class LocalMarket(Provider):
    """Worker processes on this computer, rented from a catalog of offers (see ``docs/catalog.md``)."""

    name = "local"

    def __init__(self, catalog_path: str | os.PathLike[str] | None = None,
                 state_dir: str | os.PathLike[str] | None = None, *, heartbeat_timeout_s: float = 10.0,
                 stop_grace_s: float = 10.0, clock: Callable[[], float] = time.time,
                 seed: str | None = None) -> None:
        self.catalog_path = Path(catalog_path) if catalog_path else default_catalog_path()
        # c.PortableLocal.seed: None reads it (its variable) at each draw, as every process sharing the market does
        self.seed = seed
        self.state_dir = Path(state_dir) if state_dir else default_market_dir()
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.stop_grace_s = stop_grace_s
        # boot delays, heartbeats and spend are judged on this clock (seconds since the
        # epoch, as the workers' heartbeats are written); tests pass one they control
        self.clock = clock
        self._state = _State(self.state_dir)
        self._catalog: Catalog | None = None
        self._catalog_key: tuple[int, int] | None = None

    @property
    def catalog(self) -> Catalog:
        """The catalog, read again whenever the file changed (the server outlives edits)."""
        try:
            st = self.catalog_path.stat()
            key = (st.st_mtime_ns, st.st_size)
        except OSError:
            key = None
        if self._catalog is None or key is None or key != self._catalog_key:
            self._catalog = load_catalog(self.catalog_path)
            self._catalog_key = key
        return self._catalog

    # -- accounting --

    def _observe(self, rec: dict[str, Any], now: float) -> tuple[str, str | None]:
        """The allocation's state now; an active one found dead or silent is marked lost in ``rec``."""
        if rec["state"] != "active":
            return rec["state"], rec.get("stop_reason")
        aid, pid = rec["allocation_id"], rec["pid"]
        if not _alive(pid, aid):
            rec.update(state="lost", stop_reason="the worker process exited", ended_at=now)
            return "lost", rec["stop_reason"]
        if now - rec["started_at"] < rec["boot_seconds"]:
            return "pending", None
        try:
            beat = float((Path(rec["dir"]) / "heartbeat").read_text())
        except (OSError, ValueError):
            beat = None
        if beat is None:
            if now - rec["started_at"] < rec["boot_seconds"] + self.heartbeat_timeout_s:
                return "running", None  # booted; the worker has not written its first beat yet
            reason = "the worker never sent a heartbeat"
        elif now - beat <= self.heartbeat_timeout_s:
            return "reachable", None
        else:
            reason = f"no heartbeat for {now - beat:.0f}s"
        # a silent worker is released, as a market reclaims an unresponsive host
        rec.update(state="lost", stop_reason=reason, ended_at=now)
        _signal(pid, aid, signal.SIGKILL)
        return "lost", reason

    def _in_use(self, data: dict[str, Any], offer_id: str) -> int:
        now = self.clock()
        return sum(1 for rec in data["allocations"].values()
                   if rec["offer_id"] == offer_id and self._observe(rec, now)[0] not in ("lost", "terminated"))

    def _listed(self, offer: Offer) -> Offer:
        listed = self.catalog.offer(offer.id) if offer.provider == self.name else None
        if listed is None:
            raise NoCapacity(f"{offer.key} is not listed by the local market ({self.catalog_path})",
                             provider=self.name, offer=offer.id)
        return listed

    def _check_quota(self, data: dict[str, Any], offer: Offer, in_use: int) -> None:
        quota = self.catalog.quotas.get(offer.id)
        if quota is not None and in_use >= quota:
            raise QuotaExceeded(f"{offer.key}: the quota of {quota} machine(s) is used up ({in_use} running)",
                                provider=self.name, offer=offer.id)

    def _check_free(self, offer: Offer, in_use: int) -> int:
        cap = offer.capacity or 0
        if in_use >= cap:
            why = "sold out (capacity 0)" if cap == 0 else f"all {cap} machine(s) are in use"
            raise NoCapacity(f"{offer.key}: {why}", provider=self.name, offer=offer.id)
        return cap - in_use

    # -- the Provider contract --

    def offers(self, requirements: Requirements | None = None) -> list[Offer]:
        """Every catalog offer, ``capacity`` less the allocations of it now running.
        Not pre-filtered: routing shows blocked routes with their reasons."""
        offers = self.catalog.offers
        with self._state.locked() as data:
            used = {o.id: self._in_use(data, o.id) for o in offers}
        return [dataclasses.replace(o, capacity=max(0, (o.capacity or 0) - used[o.id])) for o in offers]

    def check_permission(self, offer: Offer) -> None:
        """Always permitted, unless the catalog gives the offer a ``quota`` and it is used up."""
        listed = self.catalog.offer(offer.id)
        if listed is None or listed.id not in self.catalog.quotas:
            return
        with self._state.locked() as data:
            self._check_quota(data, listed, self._in_use(data, listed.id))

    def check_capacity(self, offer: Offer) -> int:
        """How many more can start now; NoCapacity when none."""
        listed = self._listed(offer)
        with self._state.locked() as data:
            return self._check_free(listed, self._in_use(data, listed.id))

    def launch(self, offer: Offer, *, allocation_id: str, image: str | None = None,
               ssh_public_key: str | None = None, env: dict[str, str] | None = None) -> Allocation:
        """Start a worker process in a fresh folder; it is ``pending`` for the offer's ``boot_seconds``.

        Fails with LaunchFailed at the offer's ``launch_failure_rate`` (reproducibly when
        ``c.PortableLocal.seed`` is set). ``ssh_public_key`` is unused: local workers
        are reached through their folder.
        """
        if not _ALLOCATION_ID.match(allocation_id):
            raise UsageError(f"bad allocation id {allocation_id!r}: letters, digits, '.', '_', '-' only")
        listed = self._listed(offer)
        failure: LaunchFailed | None = None
        with self._state.locked() as data:
            in_use = self._in_use(data, listed.id)
            self._check_quota(data, listed, in_use)
            self._check_free(listed, in_use)
            folder = self.state_dir / "allocations" / allocation_id
            if allocation_id in data["allocations"] or folder.exists():
                raise UsageError(f"allocation id {allocation_id} was already used in this market")
            if image and listed.images and image not in listed.images:
                raise LaunchFailed(f"{listed.key} does not offer image {image}", provider=self.name,
                                   offer=listed.id)
            draw = self._draw(data["launches"])
            data["launches"] += 1
            if draw < listed.launch_failure_rate:
                # raised after the lock is released, so the draw counter is kept
                failure = LaunchFailed(f"{listed.key}: the market accepted the launch and the machine failed to "
                                       f"start (launch failure rate {listed.launch_failure_rate:.0%})",
                                       provider=self.name, offer=listed.id, hint="try again, or another route")
            else:
                rec = self._start(listed, allocation_id, folder, image, env)
                data["allocations"][allocation_id] = rec
        if failure:
            raise failure
        return self._allocation(rec)

    def _draw(self, n: int) -> float:
        from jupyter_portable.compute.config import PortableLocal

        seed = self.seed if self.seed is not None else PortableLocal().seed
        # seeded per launch number, so every process sharing the market draws the same sequence
        return random.Random(f"{seed}/{n}").random() if seed else random.random()

    def _start(self, offer: Offer, allocation_id: str, folder: Path, image: str | None,
               env: dict[str, str] | None) -> dict[str, Any]:
        bin_dir, work = folder / "bin", folder / "work"
        work.mkdir(parents=True)
        write_fake_nvidia_smi(bin_dir, gpu=offer.gpu, count=offer.gpu_count,
                              memory_mb=round(offer.gpu_memory_gb * 1024),
                              driver=self.catalog.actual_drivers.get(offer.id, offer.driver or ""),
                              cuda=offer.cuda or "", uuid_seed=allocation_id)
        # a machine of the market stands for someone else's: it inherits none of the user's keys or
        # the providers' (what the caller passes in ``env`` it passes on purpose)
        child_env = {**scrubbed(os.environ), **(env or {})}
        child_env["PATH"] = f"{bin_dir}{os.pathsep}{child_env.get('PATH', '')}"
        child_env["JUPYTER_PORTABLE_ALLOCATION"] = allocation_id
        # the worker must import this very package, even from a source checkout
        pkg_root = str(Path(__file__).resolve().parents[2])
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, child_env.get("PYTHONPATH")) if p)
        if image:
            child_env[IMAGE_ENV] = image
        else:
            child_env.pop(IMAGE_ENV, None)
        started = self.clock()
        with open(folder / "agent.log", "ab") as log:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "jupyter_portable.compute.agent_stub", "--dir", str(folder),
                     "--allocation", allocation_id],
                    cwd=work, env=child_env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    start_new_session=True, close_fds=True)
            except OSError as exc:
                raise LaunchFailed(f"{offer.key}: cannot start the worker: {exc.strerror or exc}",
                                   provider=self.name, offer=offer.id) from exc
        _CHILDREN[proc.pid] = proc
        return {"allocation_id": allocation_id, "offer_id": offer.id, "pid": proc.pid, "dir": str(folder),
                "bin": str(bin_dir), "work": str(work), "image": image, "started": from_timestamp_iso(started),
                "started_at": started, "boot_seconds": offer.boot_seconds, "price_per_hour": offer.price_per_hour,
                "state": "active", "stop_reason": None, "ended_at": None}

    def _allocation(self, rec: dict[str, Any]) -> Allocation:
        return Allocation(allocation_id=rec["allocation_id"], provider=self.name, offer_id=rec["offer_id"],
                          ref=str(rec["pid"]), started=rec["started"], ssh=None,
                          details={"dir": rec["dir"], "bin": rec["bin"], "work": rec["work"], "pid": rec["pid"],
                                   "image": rec["image"], "local": True})

    def status(self, allocation: Allocation) -> AllocationStatus:
        """``pending`` while booting, ``reachable`` while the heartbeat is fresh, ``lost`` when the
        worker died, went silent or the market took it back, ``terminated`` after terminate."""
        with self._state.locked() as data:
            rec = data["allocations"].get(allocation.allocation_id)
            if rec is None:
                return AllocationStatus(state="lost", reason="the local market does not know this allocation")
            state, reason = self._observe(rec, self.clock())
            return AllocationStatus(state=state, reason=reason, spend=self._spend(rec))

    def _spend(self, rec: dict[str, Any]) -> float:
        end = rec["ended_at"] or self.clock()
        return round(rec["price_per_hour"] * max(0.0, end - rec["started_at"]) / 3600, 6)

    def terminate(self, allocation: Allocation) -> None:
        """SIGTERM the worker (SIGKILL after a grace period) and mark it terminated; idempotent.
        A lost allocation stays lost: its reason is the one that matters."""
        with self._state.locked() as data:
            rec = data["allocations"].get(allocation.allocation_id)
            if rec is None:
                return
            if rec["state"] == "active":
                rec.update(state="terminated", stop_reason="terminated on request", ended_at=self.clock())
            pid = rec["pid"]
        _stop(pid, allocation.allocation_id, grace=self.stop_grace_s)

    def lose(self, allocation_id: str, reason: str = LOST_BY_MARKET) -> None:
        """The market takes the machine back: SIGKILL, state ``lost`` with ``reason``."""
        lose_allocation(self.state_dir, allocation_id, reason)

    def reserve(self, offer: Offer, *, start: str, hours: float) -> Reservation:
        """Book a capacity-checked slot: refused (NoCapacity) when the offer has no capacity.
        Overlapping bookings are the calendar's business, not this check's."""
        listed = self._listed(offer)
        if not listed.reservable:
            raise NotSupported(f"{listed.key} is not sold as a reservation", provider=self.name, offer=listed.id,
                               hint="book a scheduled slot instead: acquiring starts ahead of it")
        if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not math.isfinite(hours) or hours <= 0:
            raise UsageError(f"hours must be a positive number, got {hours!r}")
        parse_iso(start, "start")
        if not listed.capacity:
            raise NoCapacity(f"{listed.key} has no capacity for a slot at {start} ({hours:g} h)",
                             provider=self.name, offer=listed.id,
                             hint="choose another start time, fewer hours, or another offer")
        res = Reservation(reservation_id=f"res-{uuid.uuid4().hex[:12]}", provider=self.name, offer_id=listed.id,
                          start=start, hours=float(hours), guarantee="capacity-checked",
                          price=round(listed.price_per_hour * hours, 2), details={"region": listed.region})
        with self._state.locked() as data:
            data["reservations"][res.reservation_id] = {"offer_id": res.offer_id, "start": start, "hours": res.hours,
                                                        "price": res.price, "state": "booked"}
        return res

    def cancel_reservation(self, reservation: Reservation) -> None:
        """Always allowed in the local market; cancelling twice is not an error."""
        with self._state.locked() as data:
            rec = data["reservations"].get(reservation.reservation_id)
            if rec is not None:
                rec["state"] = "cancelled"

    # -- for the UI and the CLI --

    def allocation(self, allocation_id: str) -> Allocation:
        """The :class:`Allocation` of a recorded allocation (e.g. one another process launched)."""
        with self._state.locked() as data:
            rec = data["allocations"].get(allocation_id)
        if rec is None:
            raise UsageError(f"the local market has no allocation {allocation_id!r}")
        return self._allocation(rec)

    def list_allocations(self) -> list[dict[str, Any]]:
        """Every allocation the market recorded, oldest first, with its state now and spend."""
        out = []
        with self._state.locked() as data:
            now = self.clock()
            for rec in data["allocations"].values():
                state, reason = self._observe(rec, now)
                out.append({"allocation_id": rec["allocation_id"], "offer_id": rec["offer_id"], "pid": rec["pid"],
                            "dir": rec["dir"], "started": rec["started"], "state": state, "stop_reason": reason,
                            "ended": from_timestamp_iso(rec["ended_at"]) if rec["ended_at"] else None,
                            "spend": self._spend(rec)})
        return sorted(out, key=lambda r: (r["started"], r["allocation_id"]))


__all__ = ["LOST_BY_MARKET", "MARKET_DIR_ENV", "SEED_ENV", "LocalMarket", "default_market_dir", "lose_allocation"]
