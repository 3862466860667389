"""The ``ssh`` provider: the user's own machines (:mod:`.hosts`), reached with OpenSSH (:mod:`.sshlink`).

Each configured host is one offer with capacity 1, or 0 while one of our allocations runs
there. Launching starts the worker stub (:mod:`.agent_stub`) on the host in its own session,
under ``<workdir>/allocations/<allocation id>/``; status reads its heartbeat back over SSH
(the remote half is :mod:`.hostside`, streamed to the host's Python).

Local state, in ``$JUPYTER_PORTABLE_SSH_STATE`` or ``<jupyter data dir>/portable/ssh``:
``known_hosts`` (host keys pinned on first use, see :mod:`.sshlink`) and ``allocations.json``
(which allocation holds which host). A host stays in use until :meth:`SshProvider.terminate`,
even when its worker looks lost: an unreachable worker may still be running, and handing the
host out twice is worse than waiting.

Nothing secret is logged or put in argv: ``env`` for the worker travels inside the script on ssh's stdin.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from jupyter_portable.compute import agent_stub
from jupyter_portable.compute.base import Allocation, AllocationStatus, Provider, SshEndpoint
from jupyter_portable.compute.hosts import Host, load_hosts
from jupyter_portable.compute.sshlink import SshLink, default_state_dir, first_line, last_line, remote_python
from jupyter_portable.core.errors import (
    ComputeError,
    LaunchFailed,
    NoCapacity,
    NotSupported,
    ProviderUnavailable,
    UsageError,
)
from jupyter_portable.core.offers import Offer, Requirements
from jupyter_portable.core.secretenv import ALLOWED_NAMES, ALLOWED_PREFIXES, SECRET_NAMES, SECRET_SUFFIXES
from jupyter_portable.core.times import now_iso
from jupyter_portable.workdir.files import atomic_write, file_lock

ENV_STATE = "JUPYTER_PORTABLE_SSH_STATE"
_ALLOCATION_ID = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
_ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
# Characters only a shell command line needs: an interpreter's path holding one is refused
# rather than quoted, since its author meant the shell to read it.
_IN_USE = ("launching", "running")
_KEEP_ENDED = 200  # ended allocations kept in allocations.json as history
_LAUNCH_CLAIM = 600.0  # seconds a launch in progress holds its host (launches time out well before)

# The remote half: compute/hostside.py, streamed to the host's ``python3 -`` with one call after it.

@functools.cache
def _hostside_source() -> str:
    """The source of :mod:`.hostside`, as the host's Python runs it."""
    from jupyter_portable.compute import hostside

    return Path(hostside.__file__).read_text(encoding="utf-8")


def _holder(table: dict[str, dict[str, Any]], host: str) -> str | None:
    """The allocation holding ``host``: a running one, or a launch still within its time."""
    for aid, rec in table.items():
        if rec.get("host") != host:
            continue
        if rec.get("state") == "running":
            return aid
        # A launch whose process died before recording its outcome must not hold the host forever.
        if rec.get("state") == "launching" and time.time() - float(rec.get("claimed") or 0) < _LAUNCH_CLAIM:
            return aid
    return None


class _State:
    """``allocations.json``: which of our allocations holds which host. Read-modify-write under a lock."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.file = directory / "allocations.json"

    @contextlib.contextmanager
    def edit(self) -> Iterator[dict[str, dict[str, Any]]]:
        """The allocations table, locked; written back atomically when the block ends without error."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with file_lock(self.dir / "allocations.lock"):
            table = self._read()
            before = json.dumps(table, sort_keys=True)
            yield table
            if json.dumps(table, sort_keys=True) != before:
                self._write(table)

    def holder(self, host: str) -> str | None:
        """The allocation of ours that holds ``host``, if any."""
        with self.edit() as table:
            return _holder(table, host)

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise UsageError(f"ssh provider state {self.file} cannot be read: {exc}",
                             hint="move the file away; hosts it marked as in use become free") from exc
        table = data.get("allocations") if isinstance(data, dict) and data.get("version") == 1 else None
        if not isinstance(table, dict) or not all(isinstance(rec, dict) for rec in table.values()):
            raise UsageError(f"ssh provider state {self.file} is not version 1 of its format",
                             hint="move the file away; hosts it marked as in use become free")
        return table

    def _write(self, table: dict[str, dict[str, Any]]) -> None:
        ended = sorted((rec.get("ended") or "", aid) for aid, rec in table.items() if rec.get("state") not in _IN_USE)
        for _, aid in ended[:-_KEEP_ENDED] if len(ended) > _KEEP_ENDED else []:
            del table[aid]
        atomic_write(self.file, json.dumps({"version": 1, "allocations": table}, indent=1, sort_keys=True).encode())


class SshProvider(Provider):
    """Machines the user already has, reached over SSH. See the module docstring for the rules."""

    name = "ssh"

    def __init__(self, hosts: Sequence[Host] | None = None, *, hosts_file: Path | str | None = None,
                 state_dir: Path | str | None = None, ssh: str = "ssh", connect_timeout: float = 10.0,
                 command_timeout: float = 60.0, stale_after: float = 10.0, launch_wait: float = 20.0,
                 known_hosts: Path | None = None, multiplex: bool = False,
                 keepalive: tuple[int, int] = (10, 3)) -> None:
        """``hosts`` fixes the host list; otherwise ``hosts_file`` (or the default) is re-read on each call,
        so edits apply without a restart. ``stale_after``: seconds without a heartbeat before a worker is lost.
        ``known_hosts``: a file of pinned host keys to hold the hosts to strictly (a cloud allocation's own,
        see :mod:`.keys`); without it, keys are trusted on first use into the state dir's. ``multiplex``:
        share one connection between commands. ``keepalive``: ssh's ServerAlive (seconds, count); see
        :class:`.SshLink`."""
        self._fixed = list(hosts) if hosts is not None else None
        self._hosts_file = hosts_file
        self.state_dir = Path(state_dir).expanduser() if state_dir is not None else default_state_dir()
        self._state = _State(self.state_dir)
        self.link = SshLink(self.hosts, state_dir=self.state_dir, ssh=ssh, connect_timeout=connect_timeout,
                            command_timeout=command_timeout, known_hosts=known_hosts, multiplex=multiplex,
                            keepalive=keepalive)
        self.connect_timeout = connect_timeout
        self.stale_after = stale_after
        self.launch_wait = launch_wait

    @property
    def known_hosts(self) -> Path:
        """Where host keys are pinned (on first use, unless a pinned file was given)."""
        return self.link.known_hosts

    # -- the Provider contract ---------------------------------------------------------------

    def hosts(self) -> list[Host]:
        """The configured hosts."""
        return list(self._fixed) if self._fixed is not None else load_hosts(self._hosts_file)

    def offers(self, requirements: Requirements | None = None) -> list[Offer]:
        """One offer a host; capacity 0 while an allocation of ours holds it. Reads no network."""
        hosts = self.hosts()
        with self._state.edit() as table:
            held = {h.name for h in hosts if _holder(table, h.name)}
        return [h.offer(0 if h.name in held else 1) for h in hosts]

    def check_permission(self, offer: Offer) -> None:
        """Log in and run ``true``: AuthError for a refused key or a changed host key,
        ProviderUnavailable when nothing answers."""
        host = self.link.host(offer.id)
        proc = self.link.shell(host, "true")
        if proc.returncode != 0:
            raise ProviderUnavailable(f"ssh host {host.name}: `true` failed there ({proc.returncode}): "
                                      f"{first_line(proc.stderr)}", provider=self.name, offer=host.name)

    def check_capacity(self, offer: Offer) -> int | None:
        """1 when no allocation of ours holds the host; NoCapacity otherwise."""
        host = self.link.host(offer.id)
        holder = self._state.holder(host.name)
        if holder:
            raise NoCapacity(f"ssh host {host.name} is in use by allocation {holder}", provider=self.name,
                             offer=host.name, hint=f"terminate allocation {holder}, or pick another host")
        return 1

    def launch(self, offer: Offer, *, allocation_id: str, image: str | None = None,
               ssh_public_key: str | None = None, env: dict[str, str] | None = None) -> Allocation:
        """Start the worker stub on the host, detached, and wait for its first heartbeat.

        ``ssh_public_key`` is not used: the host is reached with the configured key. ``env``
        is given to the worker's environment and never written to disk or argv."""
        host = self.link.host(offer.id)
        if image:
            raise NotSupported(f"ssh host {host.name} runs its own environment; images are not supported",
                               provider=self.name, offer=host.name, hint="drop the image requirement for ssh hosts")
        if not _ALLOCATION_ID.match(allocation_id):
            raise UsageError(f"allocation id {allocation_id!r} is not letters, digits, '.', '_' or '-'")
        remote_python(host)  # refused before the host is claimed
        env = dict(env or {})
        bad = [k for k, v in env.items() if not _ENV_NAME.match(k) or not isinstance(v, str)]
        if bad:
            raise UsageError(f"bad environment variable name(s) or value(s): {', '.join(sorted(bad))}")
        started = now_iso("seconds")
        with self._state.edit() as table:
            holder = _holder(table, host.name)
            if holder:
                raise NoCapacity(f"ssh host {host.name} is in use by allocation {holder}", provider=self.name,
                                 offer=host.name, hint=f"terminate allocation {holder}, or pick another host")
            # Claimed before connecting, so two launches cannot both take the host.
            table[allocation_id] = {"host": host.name, "state": "launching", "started": started,
                                    "claimed": time.time()}
        try:
            out = self._python(host, "launch", {"workdir": host.workdir, "allocation": allocation_id,
                                               "source": _agent_source(), "env": env, "wait": self.launch_wait,
                                               "allowed_names": sorted(ALLOWED_NAMES),
                                               "allowed_prefixes": list(ALLOWED_PREFIXES),
                                               "secret_names": sorted(SECRET_NAMES),
                                               "secret_suffixes": list(SECRET_SUFFIXES)},
                               timeout=self.launch_wait + self.connect_timeout + 10)
            if "error" in out:
                log = str(out.get("log") or "").strip()
                raise LaunchFailed(f"ssh host {host.name}: {out['error']}" + (f"; its log ends: {log[-500:]}"
                                                                            if log else ""),
                                   provider=self.name, offer=host.name,
                                   hint=f"check that `{host.python}` runs on {host.name}")
            pid = int(out["agent"]["pid"])
            remote_dir = str(out["remote_dir"])
        except Exception as exc:
            with self._state.edit() as table:
                table[allocation_id] = {"host": host.name, "state": "failed", "started": started,
                                        "ended": now_iso("seconds"),
                                        "reason": exc.one_line() if isinstance(exc, ComputeError) else repr(exc)}
            if isinstance(exc, LaunchFailed):
                raise
            if isinstance(exc, ComputeError):
                raise LaunchFailed(f"launch on ssh host {host.name} failed: {exc}", provider=self.name,
                                   offer=host.name, hint=exc.hint) from exc
            raise LaunchFailed(f"launch on ssh host {host.name} failed: the worker's answer was not understood "
                               f"({exc!r})", provider=self.name, offer=host.name) from exc
        with self._state.edit() as table:
            table[allocation_id].update(state="running", pid=pid, remote_dir=remote_dir)
        return Allocation(allocation_id=allocation_id, provider=self.name, offer_id=host.name,
                          ref=f"{host.name}:{pid}", started=started,
                          ssh=SshEndpoint(host=host.host, port=host.port, user=host.user),
                          details={"remote_dir": remote_dir, "pid": pid})

    def status(self, allocation: Allocation) -> AllocationStatus:
        """``reachable`` while the worker is alive and its heartbeat is under ``stale_after`` seconds
        old (by the host's clock); ``lost`` when the host answers that the worker is gone or writes no
        heartbeat; ``running`` when its process lives but its heartbeat is stale; ``unknown`` when the
        host does not answer (an SSH or transport error says nothing of the worker: issue 42)."""
        endpoint = allocation.ssh
        with self._state.edit() as table:
            rec = table.get(allocation.allocation_id, {})
        if rec.get("state") == "terminated":
            return AllocationStatus("terminated", ssh=endpoint)
        try:
            host = self.link.host(allocation.offer_id)
            out = self._python(host, "status", self._worker_args(allocation), timeout=self.connect_timeout + 10)
        except (ComputeError, UsageError) as exc:
            return AllocationStatus("unknown", ssh=endpoint, reason=f"ssh host does not answer: {exc.one_line()}")
        if not out.get("alive"):
            why = "the worker stopped" if out.get("stopped") else "the worker process is gone"
            return AllocationStatus("lost", ssh=endpoint, reason=f"{why} on ssh host {host.name}")
        if out.get("heartbeat") is None:
            return AllocationStatus("lost", ssh=endpoint, reason=f"the worker on {host.name} writes no heartbeat")
        age = float(out["now"]) - float(out["heartbeat"])
        if age > self.stale_after:
            # the process lives: the heartbeat decides (core.reachability), not this one look
            return AllocationStatus("running", ssh=endpoint,
                                    reason=f"the worker's last heartbeat on {host.name} is {age:.0f}s old")
        return AllocationStatus("reachable", ssh=endpoint)

    def terminate(self, allocation: Allocation, *, grace: float = 5.0) -> None:
        """Stop the worker (SIGTERM, SIGKILL after ``grace`` seconds), close our port forwards to it,
        and free the host. Already gone is fine; a host that does not answer raises ProviderUnavailable
        and the host stays in use, since the worker may still run."""
        self.link.close_forwards(allocation.allocation_id)
        with self._state.edit() as table:
            rec = table.get(allocation.allocation_id, {})
        if rec.get("state") == "terminated":
            return
        host = self.link.host(allocation.offer_id)
        if allocation.details.get("pid") is not None:
            out = self._python(host, "terminate", {**self._worker_args(allocation), "grace": grace},
                               timeout=grace + self.connect_timeout + 15)
            if not out.get("gone"):
                raise ProviderUnavailable(f"the worker of {allocation.allocation_id} on ssh host {host.name} "
                                          f"survived SIGKILL", provider=self.name, offer=host.name)
        with self._state.edit() as table:
            rec = table.setdefault(allocation.allocation_id, {"host": host.name, "started": allocation.started})
            rec.update(state="terminated", ended=now_iso("seconds"))

    # -- commands and tunnels: the transport's (sshlink) ----------------------------------------

    def run(self, target: Allocation | Offer | str, argv: Sequence[str], *, timeout: float | None = None,
            input: str | None = None) -> tuple[int, str, str]:
        """Run ``argv`` on a host: :meth:`.SshLink.run`."""
        return self.link.run(target, argv, timeout=timeout, input=input)

    def exec_bytes(self, target: Allocation, command: str, data: bytes | None, timeout: float
                   ) -> tuple[int, bytes, bytes]:
        """Run a shell command line with bytes both ways: :meth:`.SshLink.exec_bytes`."""
        return self.link.exec_bytes(target, command, data, timeout)

    def forward_port(self, allocation: Allocation, remote_port: int, *, remote_host: str = "127.0.0.1",
                     timeout: float | None = None) -> tuple[int, Callable[[], None]]:
        """A local port forwarded to the host: :meth:`.SshLink.forward_port`; :meth:`terminate` closes it."""
        return self.link.forward_port(allocation, remote_port, remote_host=remote_host, timeout=timeout)

    def forward_ports(self, allocation: Allocation, remote_ports: Sequence[int], *, remote_host: str = "127.0.0.1",
                      timeout: float | None = None) -> tuple[list[int], Callable[[], None]]:
        """Local ports forwarded through one connection: :meth:`.SshLink.forward_ports`."""
        return self.link.forward_ports(allocation, remote_ports, remote_host=remote_host, timeout=timeout)

    # -- plumbing ----------------------------------------------------------------------------

    def _worker_args(self, allocation: Allocation) -> dict[str, Any]:
        pid, remote_dir = allocation.details.get("pid"), allocation.details.get("remote_dir")
        if not isinstance(pid, int) or not isinstance(remote_dir, str):
            raise UsageError(f"allocation {allocation.allocation_id} has no worker pid and remote_dir")
        return {"pid": pid, "remote_dir": remote_dir, "allocation": allocation.allocation_id}

    def _python(self, host: Host, function: str, payload: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        """Run one function of :mod:`.hostside` on the host's Python; its last stdout line is its answer."""
        source = (_hostside_source() +
                  f"\nprint(json.dumps({function}(json.loads({json.dumps(payload)!r}))))\n")
        proc = self.link.shell(host, f"{remote_python(host)} -", input=source, timeout=timeout)
        lines = proc.stdout.strip().splitlines()
        try:
            answer = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise ProviderUnavailable(f"ssh host {host.name}: `{host.python} -` failed ({proc.returncode}): "
                                      f"{last_line(proc.stderr) or last_line(proc.stdout)}",
                                      provider=self.name, offer=host.name,
                                      hint=f"set `python` for {host.name} in hosts.toml to a Python 3 there")
        return answer



def _agent_source() -> str:
    with open(agent_stub.__file__, encoding="utf-8") as fh:
        return fh.read()


__all__ = ["ENV_STATE", "SshProvider", "default_state_dir"]
