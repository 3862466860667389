"""The ``slurm`` provider: a cluster's GPUs, asked for the way a user asks, with the Slurm commands
on its login node over SSH (the user's own SSH config and keys; the login node may be this computer).
No admin rights and no slurmrestd are needed.

- **Offers** come from ``sinfo``: one a partition, GRES GPU type and count (1 and a whole node's),
  for partitions that are up and have a node that is not down or drained; the time limit is the
  partition's. The price is the cluster's: ``$0``, or ``gpu_hour_rate`` x GPUs when the user sets an
  internal rate. The **queue wait** is Slurm's own forecast, ``sbatch --test-only``'s expected start,
  kept in ``offer.extra["queue_s"]``; routing prices it beside a cloud's "now" (an offer Slurm
  cannot place is listed with capacity 0 and Slurm's reason).
- **Launch** submits a batch job named ``jupyter-portable.<allocation>.<workspace>`` (so that
  ``squeue`` finds every one of ours) with ``--no-requeue`` and ``--signal=B:USR1@<lead>``. The job
  holds the GPUs on its compute node and keeps a heartbeat under ``<workdir>/allocations/<allocation>/``;
  it passes the warning signal on to the allocation's worker (which publishes, worker/warning.py) and
  ends the worker when it ends. A job queued ahead (:meth:`SlurmProvider.queue_next`) is taken up by
  the next launch of its shape for the workspace. Once it runs, the allocation's SSH endpoint is its
  node (the address Slurm has for it, port ``node_ssh_port``), reached as every rented machine is: its
  host key pinned on first contact for this allocation, the worker installed by the same bootstrap
  (:mod:`jupyter_portable.worker.bootstrap`).
- **Status and losses** are Slurm's own states (``squeue --json``): PENDING is pending (Slurm's
  reason said), RUNNING is running; TIMEOUT is lost "time limit reached", PREEMPTED is lost
  "preempted by partition <the partition whose job took the node>", NODE_FAIL "node failure",
  CANCELLED by anyone but us "cancelled outside jupyter-portable (an admin or scancel)", a running
  job that went back to the queue "requeued". A job Slurm no longer lists is lost too.
- **The login node** is reached through one shared SSH connection (``ControlMaster``, as a rented
  machine is): the loss check's ``squeue`` every few seconds and a launch's several commands pay for
  one handshake, not one each.
- **Terminate** marks the job (its comment) and ``scancel``\\ s it; a job already ended is fine.

Every answer of the commands is checked on the way in: output that is not what Slurm writes is
refused with ProviderUnavailable naming the command, never guessed at.
"""

from __future__ import annotations

import getpass
import json
import math
import re
import shlex
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jupyter_portable.compute.base import (
    WORKSPACE_ENV,
    Allocation,
    AllocationStatus,
    MachineInfo,
    Provider,
    SshEndpoint,
    machine_name,
    parse_machine_name,
    spend_since,
)
from jupyter_portable.compute.hosts import Host
from jupyter_portable.compute.slurm_text import (
    _GRES_GPU,
    _ID,
    _JOB_ID,
    _PENDING,
    _RUNNING,
    GPU_MEMORY_GB,
    Partition,
    _bad,
    check_job,
    loss_reason,
    parse_sinfo,
    parse_test_only,
    parse_time_limit,
    slurm_minutes,
)
from jupyter_portable.core.errors import LaunchFailed, NoCapacity, NotSupported, ProviderUnavailable, UsageError
from jupyter_portable.core.offers import Offer, Requirements
from jupyter_portable.core.times import now_iso

LOGIN = "login"  # the login node's name as the inner SSH provider knows it
TERMINATED_COMMENT = "jupyter-portable:terminated"
_ALLOCATION_ID = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
_WORKDIR = re.compile(r"\A(~/|/)[A-Za-z0-9._/+-]{0,500}\Z")


class SlurmProvider(Provider):
    """A Slurm cluster reached through its login node. See the module docstring for the rules."""

    name = "slurm"

    def __init__(self, login_host: str = "", *, login_port: int = 22, login_user: str = "",
                 key: Path | str | None = None, gpu_hour_rate: float = 0.0, signal_lead_s: float = 300,
                 time_limit_s: int | None = None, partitions: Sequence[str] = (), node_ssh_port: int = 22,
                 workdir: str | None = None, gpu_memory: dict[str, float] | None = None,
                 state_dir: Path | str | None = None, ssh: str = "ssh", connect_timeout: float = 10.0,
                 command_timeout: float = 60.0, queue_next_job: bool = False, proxy_jump: bool = True) -> None:
        """``login_host``: the login node as ssh reaches it (a name from ~/.ssh/config works).
        ``gpu_hour_rate``: the cluster's internal $ per GPU-hour (0: free). ``signal_lead_s``: seconds
        of warning before the walltime. ``time_limit_s``: the walltime asked for (None or 0: the partition's).
        ``partitions``: only these (empty: all). ``node_ssh_port``: sshd's port on compute nodes.
        ``key`` and ``workdir`` default to ``c.PortableRemote``'s (the key rented machines are reached
        with, where one is named; else ssh's own keys and config). ``queue_next_job``: queue each job's
        successor while it runs (:meth:`queue_next`). ``proxy_jump``: reach compute nodes through the
        login node (:meth:`through_login`); off: directly, at the address Slurm has for them."""
        from jupyter_portable.compute.sshlink import SshLink, default_state_dir
        from jupyter_portable.core.envconfig import PortableRemote

        remote = PortableRemote.current()
        key = key if key is not None else (remote.ssh_key or None)
        workdir = workdir if workdir is not None else remote.workdir

        if not login_host:
            raise UsageError("slurm: no login node is set",
                             hint="set c.PortableSlurm.login_host (or JUPYTER_PORTABLE_SLURM_LOGIN) to its login node")
        if not (gpu_hour_rate >= 0) or math.isinf(gpu_hour_rate):
            raise UsageError(f"slurm: gpu_hour_rate must be a price of 0 or more, got {gpu_hour_rate!r}")
        if signal_lead_s < 0 or (time_limit_s is not None and time_limit_s < 0):
            raise UsageError("slurm: signal_lead_s and time_limit_s must be 0 or more")
        time_limit_s = time_limit_s or None  # 0: the partition's own
        if not _WORKDIR.match(workdir) or ".." in workdir.split("/"):
            raise UsageError(f"slurm: workdir {workdir!r} must be ~/... or an absolute path of plain characters")
        self.login = Host(name=LOGIN, host=login_host, port=login_port, user=login_user or getpass.getuser(),
                          key=Path(key).expanduser() if key else None, workdir=workdir)
        self.gpu_hour_rate = float(gpu_hour_rate)
        self.signal_lead_s = int(signal_lead_s)
        self.time_limit_s = time_limit_s
        self.partitions = tuple(partitions)
        self.node_ssh_port = int(node_ssh_port)
        self.queue_next_job = bool(queue_next_job)
        self.proxy_jump = bool(proxy_jump)
        self.workdir = workdir
        self.gpu_memory = {**GPU_MEMORY_GB, **{k.lower(): float(v) for k, v in (gpu_memory or {}).items()}}
        state = Path(state_dir).expanduser() if state_dir is not None else None
        self._ssh = SshLink([self.login], state_dir=state if state is not None else default_state_dir(), ssh=ssh,
                            connect_timeout=connect_timeout, command_timeout=command_timeout,
                            multiplex=True)  # one login for the loss checks' squeue, the launch's steps, ...

    # -- talking to the login node -------------------------------------------------------------

    def _command(self, script: str, what: str, *, input: str | None = None,
                 timeout: float | None = None) -> tuple[int, str, str]:
        """Run a shell script on the login node: ``(status, stdout, stderr)``; SSH's own failures raise."""
        return self._ssh.run(LOGIN, ["sh", "-c", script], input=input, timeout=timeout)  # type: ignore[no-any-return]

    def _checked(self, script: str, what: str, **kw: Any) -> str:
        code, out, err = self._command(script, what, **kw)
        if code != 0:
            raise ProviderUnavailable(f"slurm: `{what}` failed on the login node ({code}): "
                                      f"{(err.strip() or out.strip() or 'no output').splitlines()[0][:300]}",
                                      provider=self.name, hint="check that the Slurm commands run there for you")
        return out

    # -- the Provider contract -----------------------------------------------------------------

    def offers(self, requirements: Requirements | None = None) -> list[Offer]:
        """One offer a partition, GPU type and count, with Slurm's expected start as its queue wait."""
        parts = parse_sinfo(self._checked("sinfo -h -N -o '%R|%a|%l|%T|%G|%N'", "sinfo"))
        shapes: list[tuple[str, Partition, str, int]] = []
        for p in parts:
            if not p.up or (self.partitions and p.name not in self.partitions):
                continue
            for kind, most in sorted(p.gpus.items()):
                for count in sorted({1, most}):
                    shapes.append((f"{p.name}.{kind}x{count}", p, kind, count))
        if not shapes:
            return []
        waits = self._test_only([(oid, p, kind, count) for oid, p, kind, count in shapes])
        return [self._offer(oid, p.name, kind, count, self._walltime(p), *waits[oid]) for oid, p, kind, count in shapes]

    def _offer(self, oid: str, partition: str, kind: str, count: int, walltime: int | None, wait: float | None,
               why: str, **extra: Any) -> Offer:
        return Offer(
            provider=self.name, id=oid, gpu=kind.upper() if len(kind) <= 6 else kind, gpu_count=count,
            gpu_memory_gb=self.gpu_memory.get(kind.lower(), 0.0),
            price_per_hour=self.gpu_hour_rate * count, region=partition,
            # a job Slurm can place is not refused for capacity: it queues, its wait priced
            capacity=None if wait is not None else 0, boot_seconds=15.0, reliability=0.95,
            extra={"partition": partition, "gres": f"gpu:{kind}:{count}" if kind != "gpu" else f"gpu:{count}",
                   "time_limit_s": walltime, **({"queue_s": wait} if wait is not None else {}),
                   **({"queue_note": why} if why else {}), **extra})

    def queued_offer(self, allocation: Allocation, ref: str) -> Offer | None:
        """The offer of job ``ref``, queued ahead of ``allocation``'s (:meth:`queue_next`): its
        partition, GRES and walltime, as ``allocation`` records them; its queue wait 0 (it starts when
        that job ends) and ``extra["queued_ahead"]`` its job id, so the capacity check is not asked
        again (:meth:`check_capacity`). None when ``allocation`` does not record its shape."""
        d = allocation.details
        gres, partition = d.get("gres"), d.get("partition")
        shape = _GRES_GPU.match(gres) if isinstance(gres, str) else None
        if shape is None or not isinstance(partition, str) or not _ID.match(partition) or not _JOB_ID.match(ref):
            return None
        walltime = d.get("walltime_s") if isinstance(d.get("walltime_s"), int) else None
        return self._offer(allocation.offer_id, partition, shape.group(1) or "gpu", int(shape.group(2)), walltime,
                           0.0, "", queued_ahead=ref)

    def _walltime(self, p: Partition) -> int | None:
        if self.time_limit_s is None:
            return p.time_limit_s
        return self.time_limit_s if p.time_limit_s is None else min(self.time_limit_s, p.time_limit_s)

    def _test_only(self, shapes: list[tuple[str, Partition, str, int]]) -> dict[str, tuple[float | None, str]]:
        """Every shape's wait from one login: ``sbatch --test-only`` each, with the cluster's clock."""
        lines = ["printf 'now %s\\n' \"$(date +%Y-%m-%dT%H:%M:%S)\""]
        for oid, p, kind, count in shapes:
            args = self._sbatch_args(p.name, f"gpu:{kind}:{count}" if kind != "gpu" else f"gpu:{count}",
                                     self._walltime(p))
            lines.append(f"printf '@@ %s\\n' {shlex.quote(oid)}; sbatch --test-only {shlex.join(args)} "
                         "--wrap=true 2>&1; printf '@@rc %s\\n' $?")
        out = self._checked("\n".join(lines), "sbatch --test-only")
        first, _, rest = out.partition("\n")
        answers: dict[str, tuple[float | None, str]] = {}
        for block in rest.split("@@ ")[1:]:
            oid, _, body = block.partition("\n")
            text, _, rc = body.rpartition("@@rc ")
            if rc.strip() != "0":
                answers[oid.strip()] = (None, "Slurm cannot place it: " + (text.strip().splitlines() or ["?"])[-1]
                                        .removeprefix("sbatch: error: ")[:200])
                continue
            try:
                answers[oid.strip()] = (parse_test_only(text, first), "")
            except ValueError:
                raise _bad("sbatch --test-only", "no expected start time", text) from None
        missing = [s[0] for s in shapes if s[0] not in answers]
        if missing:
            raise _bad("sbatch --test-only", f"nothing for {', '.join(missing)}", out)
        return answers

    def _sbatch_args(self, partition: str, gres: str, walltime: int | None) -> list[str]:
        return ["-p", partition, f"--gres={gres}", *(["--time", slurm_minutes(walltime)] if walltime else [])]

    def check_permission(self, offer: Offer) -> None:
        """Log in to the login node and ask sinfo for the partition: AuthError when SSH refuses."""
        self._checked(f"sinfo -h -p {shlex.quote(self._partition(offer))} -o %P", "sinfo -p")

    def check_capacity(self, offer: Offer) -> int | None:
        """None (a job queues; Slurm's expected start prices the wait), or NoCapacity when Slurm
        cannot place this shape at all. An offer of a job queued ahead (:meth:`queued_offer`) is not
        asked again: that job is already in Slurm's queue, and :meth:`launch` takes it up (or, were it
        gone, submits one that sbatch itself refuses when it cannot be placed)."""
        if offer.extra.get("queued_ahead"):
            return None
        for fresh in self.offers():
            if fresh.id == offer.id:
                if fresh.capacity == 0:
                    raise NoCapacity(f"slurm partition {self._partition(offer)}: {fresh.extra.get('queue_note')}",
                                     provider=self.name, offer=offer.id)
                return None
        raise NoCapacity(f"slurm: {offer.id} is no longer offered (partition down or no usable node)",
                         provider=self.name, offer=offer.id)

    def _partition(self, offer: Offer) -> str:
        partition = offer.extra.get("partition") or offer.region
        if not isinstance(partition, str) or not _ID.match(partition):
            raise UsageError(f"slurm offer {offer.id} names no partition")
        return partition

    def job_dir(self, allocation_id: str) -> str:
        """The allocation's folder on the cluster, as a shell word (``~/`` is the remote home)."""
        path = f"{self.workdir.rstrip('/')}/allocations/{allocation_id}"
        return '"$HOME"/' + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)

    def launch(self, offer: Offer, *, allocation_id: str, image: str | None = None,
               ssh_public_key: str | None = None, env: dict[str, str] | None = None) -> Allocation:
        """Submit the allocation's batch job; returns once Slurm took it (it may queue). ``env``
        gives the workspace id for the job's name; nothing of it goes to the job."""
        if image:
            raise NotSupported("a Slurm job runs the cluster's own environment; images are not supported",
                               provider=self.name, offer=offer.id, hint="drop the image requirement for slurm")
        if not _ALLOCATION_ID.match(allocation_id):
            raise UsageError(f"allocation id {allocation_id!r} is not letters, digits, '.', '_' or '-'")
        gres = offer.extra.get("gres")
        if not isinstance(gres, str) or not _GRES_GPU.match(gres):
            raise UsageError(f"slurm offer {offer.id} names no GPU GRES")
        walltime = offer.extra.get("time_limit_s")
        walltime = walltime if isinstance(walltime, int) and walltime > 0 else self.time_limit_s
        lead = self.signal_lead_s if walltime is None else min(self.signal_lead_s, max(0, walltime // 2))
        name = machine_name(allocation_id, (env or {}).get(WORKSPACE_ENV))
        details = {"partition": self._partition(offer), "gres": gres, "name": name, "walltime_s": walltime,
                   "signal_lead_s": lead, "price_per_hour": offer.price_per_hour}
        ahead = self._queued_ahead((env or {}).get(WORKSPACE_ENV), self._partition(offer), gres)
        if ahead is not None:
            self._take_up(ahead, allocation_id, name)
            return Allocation(allocation_id=allocation_id, provider=self.name, offer_id=offer.id, ref=ahead[0],
                              started=now_iso("seconds"),
                              details={"job_id": ahead[0], "queued_ahead_as": ahead[1], **details})
        folder = self.job_dir(allocation_id)
        args = ["--parsable", "-J", name, *self._sbatch_args(self._partition(offer), gres, walltime),
                "--no-requeue", "--signal", f"B:USR1@{lead}"]
        script = _JOB_SCRIPT.replace("@DIR@", folder)
        # the job's own log goes to its folder, made first: sbatch does not make it
        submit = (f"mkdir -p {folder} && cd {folder} && exec sbatch {shlex.join(args)} "
                  f"-o slurm-%j.out -D \"$PWD\"")
        code, out, err = self._command(submit, "sbatch", input=script)
        if code != 0:
            reason = (err.strip() or out.strip() or "no output").splitlines()[-1].removeprefix("sbatch: error: ")
            error = NoCapacity if "not available" in reason or "Requested node configuration" in reason \
                else LaunchFailed
            raise error(f"slurm: sbatch refused the job: {reason[:300]}", provider=self.name, offer=offer.id)
        job_id = out.strip().split(";")[0]
        if not _JOB_ID.match(job_id):
            raise _bad("sbatch --parsable", "no job id", out)
        return Allocation(allocation_id=allocation_id, provider=self.name, offer_id=offer.id, ref=job_id,
                          started=now_iso("seconds"), details={"job_id": job_id, **details})

    # -- the next job, queued ahead ----------------------------------------------------------------

    def queue_next(self, allocation: Allocation) -> str | None:
        """With ``queue_next_job`` on: submit the job that takes over from ``allocation``'s, the same
        shape, ``--dependency=afterany:<its job>`` (it queues while that one runs and may start the moment
        it ends, whatever ended it), named for ``next-<allocation>``. :meth:`launch` of the same partition
        and GRES for the workspace takes it up. Its job id; None with the setting off."""
        if not self.queue_next_job:
            return None
        d = allocation.details
        ids = parse_machine_name(d.get("name"))
        gres, partition = d.get("gres"), d.get("partition")
        if not _JOB_ID.match(allocation.ref) or ids is None or not isinstance(partition, str) \
                or not _ID.match(partition) or not isinstance(gres, str) or not _GRES_GPU.match(gres):
            raise UsageError(f"slurm: allocation {allocation.allocation_id} names no job, partition or GRES to "
                             "queue the next job like")
        walltime = d.get("walltime_s") if isinstance(d.get("walltime_s"), int) else None
        lead = int(d.get("signal_lead_s") or self.signal_lead_s)
        aid = f"next-{allocation.allocation_id}"[:128]
        folder = self.job_dir(aid)
        args = ["--parsable", "-J", machine_name(aid, ids[1]), *self._sbatch_args(partition, gres, walltime),
                "--no-requeue", "--signal", f"B:USR1@{lead}", f"--dependency=afterany:{allocation.ref}"]
        code, out, err = self._command(f"mkdir -p {folder} && cd {folder} && exec sbatch {shlex.join(args)} "
                                       f"-o slurm-%j.out -D \"$PWD\"", "sbatch --dependency",
                                       input=_JOB_SCRIPT.replace("@DIR@", folder))
        if code != 0:
            said = (err.strip() or out.strip() or "no output")[:300]
            raise LaunchFailed(f"slurm: sbatch refused the next job: {said}", provider=self.name,
                               offer=allocation.offer_id)
        job_id = out.strip().split(";")[0]
        if not _JOB_ID.match(job_id):
            raise _bad("sbatch --parsable", "no job id", out)
        return job_id

    def _queued_ahead(self, workspace_id: str | None, partition: str, gres: str) -> tuple[str, str] | None:
        """``(job id, its allocation)`` of a job of ours queued ahead for ``workspace_id`` with this
        partition and GRES, pending or running and not ended; None when there is none."""
        if not workspace_id:
            return None
        out = self._checked("squeue --me -h -t PD,R,CF -o '%i|%j|%P|%b'", "squeue --me")
        want = gres if gres.startswith("gres:") else f"gres:{gres}"
        for line in out.splitlines():
            job_id, name, part, tres = (line.strip().split("|") + ["", "", "", ""])[:4]
            ids = parse_machine_name(name)
            if _JOB_ID.match(job_id) and ids is not None and ids[0].startswith("next-") and ids[1] == workspace_id \
                    and part == partition and tres == want:
                return job_id, ids[0]
        return None

    def _take_up(self, ahead: tuple[str, str], allocation_id: str, name: str) -> None:
        """The job queued ahead becomes ``allocation_id``'s: its name, and its folder's ``agent`` the
        new allocation's (the job signals the worker found there)."""
        job_id, old = ahead
        new_agent = shlex.quote(f"../{allocation_id}/agent")
        self._checked(f"scontrol update JobId={job_id} JobName={shlex.quote(name)} && "
                      f"mkdir -p {self.job_dir(allocation_id)} && ln -sfn {new_agent} {self.job_dir(old)}/agent",
                      "scontrol update JobName")

    def _job(self, job_id: str) -> dict[str, Any] | None:
        # Slurm 22.05's squeue --json lists every job whatever -j says, hence check_job picks ours out
        if not _JOB_ID.match(job_id):
            raise UsageError(f"slurm: {job_id!r} is not a job id")
        code, out, err = self._command(f"squeue --json -t all -j {job_id}", "squeue --json")
        if code != 0:
            if "Invalid job id" in err:
                return None  # ended long enough ago that Slurm forgot it
            raise _bad("squeue --json", f"status {code}", err)
        try:
            return check_job(json.loads(out), job_id)
        except ValueError:
            raise _bad("squeue --json", "no JSON", out) from None
        except KeyError:
            return None

    def _preemptor(self, job: dict[str, Any]) -> str | None:
        """The partition of the job that started on ``job``'s node when it was preempted (times as
        Slurm's epoch seconds, so no time zone is guessed)."""
        nodes, at = job.get("nodes"), int(job.get("preempt_time") or job.get("end_time") or 0)
        if not isinstance(nodes, str) or not re.fullmatch(r"[A-Za-z0-9._,\[\]-]{1,500}", nodes) or at <= 0:
            return None
        out = self._checked(f"squeue --json -t all -w {shlex.quote(nodes)}", "squeue --json -w")
        try:
            others = json.loads(out).get("jobs")
        except (ValueError, AttributeError):
            raise _bad("squeue --json -w", "no JSON", out) from None
        for other in others if isinstance(others, list) else []:
            if not isinstance(other, dict) or other.get("job_id") == job["job_id"] \
                    or other.get("partition") == job["partition"] or other.get("nodes") != nodes:
                continue
            started = other.get("start_time")
            if isinstance(started, int) and abs(started - at) <= 30 and isinstance(other.get("partition"), str) \
                    and _ID.match(other["partition"]):
                return str(other["partition"])
        return None

    def status(self, allocation: Allocation) -> AllocationStatus:
        """Slurm's state of the allocation's job, with the reason of a loss in the user's words."""
        job = self._job(allocation.ref)
        if job is None:
            return AllocationStatus("lost", reason=f"Slurm no longer lists job {allocation.ref}")
        state = job["job_state"]
        spend = self._spend(allocation, job)
        if job.get("comment") == TERMINATED_COMMENT:  # we asked it to end: ending or ended, it is released
            return AllocationStatus("terminated", spend=spend, spend_source="provider-rate")
        reason = loss_reason(job, preemptor=self._preemptor(job) if state == "PREEMPTED" else None)
        if reason is not None:
            return AllocationStatus("lost", reason=f"job {allocation.ref}: {reason}", spend=spend,
                                    spend_source="provider-rate")
        if state in _RUNNING:
            end = int(job.get("end_time") or 0)
            ends_at = None
            if end > 0:  # when the walltime ends the job: kept with the allocation, for a countdown
                ends_at = datetime.fromtimestamp(end, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                allocation.details["ends_at"] = ends_at
            return AllocationStatus("running", ssh=self._endpoint(job), spend=spend, spend_source="provider-rate",
                                    ends_at=ends_at)
        if state in _PENDING or state == "COMPLETING":
            why = job.get("state_reason")
            return AllocationStatus("pending", reason=f"queued in {job['partition']}" +
                                    (f" ({why})" if isinstance(why, str) and why != "None" else ""),
                                    spend=0.0, spend_source="provider-rate")
        raise _bad("squeue --json", f"a job state this provider does not know ({state})")

    def _endpoint(self, job: dict[str, Any]) -> SshEndpoint | None:
        node = job.get("batch_host") or job.get("nodes")
        if not isinstance(node, str) or not _ID.match(node):
            return None
        out = self._checked(f"sinfo -h -N -n {shlex.quote(node)} -o '%o'", "sinfo -o %o").split()
        address = out[0] if out else node
        if not re.fullmatch(r"[A-Za-z0-9_.:%-]{1,253}", address):
            raise _bad("sinfo", "a node address that is not a host name or address", address)
        return SshEndpoint(host=address, port=self.node_ssh_port, user=self.login.user, proxy=self.through_login())

    def through_login(self) -> str | None:
        """The ssh ProxyCommand that reaches a compute node through the login node (ProxyJump), held
        strictly to the login node's pinned host key; None with ``proxy_jump`` off."""
        if not self.proxy_jump:
            return None
        login = self.login
        argv = ["ssh", "-p", str(login.port), "-l", login.user, "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={self._ssh.known_hosts}",
                *(["-i", str(login.key), "-o", "IdentitiesOnly=yes"] if login.key else []), "-W", "@HP@", "--",
                login.host]
        # ssh expands %-tokens in a ProxyCommand: the target's %h:%p, and nothing in our own words
        return shlex.join(a.replace("%", "%%") for a in argv).replace("@HP@", "%h:%p")

    def _spend(self, allocation: Allocation, job: dict[str, Any]) -> float | None:
        start, end = int(job.get("start_time") or 0), int(job.get("end_time") or 0)
        if start <= 0 or job["job_state"] in _PENDING:
            return 0.0
        now = datetime.now(timezone.utc)
        stop = datetime.fromtimestamp(end, timezone.utc) if 0 < end and job["job_state"] not in _RUNNING else now
        price = allocation.details.get("price_per_hour")
        _, dollars = spend_since(float(price) if isinstance(price, (int, float)) else None,
                                 datetime.fromtimestamp(start, timezone.utc), min(stop, now))
        return dollars

    def terminate(self, allocation: Allocation) -> None:
        """Mark the job as ours to end (its comment) and scancel it; gone already is fine."""
        job_id = allocation.ref
        if not _JOB_ID.match(job_id):
            raise UsageError(f"slurm: {job_id!r} is not a job id")
        self._command(f"scontrol update JobId={job_id} Comment={TERMINATED_COMMENT} 2>/dev/null; "
                      f"scancel {job_id}", "scancel")

    def list_machines(self) -> list[MachineInfo]:
        """Every job of this user on the cluster that carries our name."""
        out = self._checked("squeue --json --me", "squeue --json --me")
        try:
            jobs = json.loads(out).get("jobs")
        except (ValueError, AttributeError):
            raise _bad("squeue --json --me", "no JSON", out) from None
        if not isinstance(jobs, list):
            raise _bad("squeue --json --me", "no jobs list")
        found = []
        for job in jobs:
            ids = parse_machine_name(job.get("name")) if isinstance(job, dict) else None
            if ids is None or job.get("user_name") not in (None, self.login.user):
                continue
            state = job.get("job_state")
            found.append(MachineInfo(provider=self.name, ref=str(job.get("job_id")), allocation_id=ids[0],
                                     workspace_id=ids[1], name=str(job.get("name")),
                                     state="running" if state in _RUNNING else "pending" if state in _PENDING
                                     else "lost", details={"partition": job.get("partition")}))
        return found


# The batch job: it holds the node's GPUs for the allocation, beats a heartbeat, and passes the
# walltime warning on to the allocation's worker (--signal=B:USR1@lead reaches this shell only): the
# worker publishes a version and reads it back. When the job ends (TERM), its worker ends with it:
# a worker started over SSH is outside the job where the cluster has no pam_slurm_adopt.
# `sleep & wait` lets a signal in.
_JOB_SCRIPT = """#!/bin/sh
dir=@DIR@
mkdir -p "$dir"
echo "$SLURM_JOB_ID" > "$dir/job"
hostname > "$dir/node"
worker() { sed -n 's/.*"pid": *\\([0-9][0-9]*\\).*/\\1/p' "$dir/agent/agent.json" 2>/dev/null; }
trap 'date +%s > "$dir/walltime-warning"; p=$(worker); [ -n "$p" ] && kill -USR1 "$p"' USR1
trap 'p=$(worker); [ -n "$p" ] && kill -TERM "$p"; exit 0' TERM
while :; do
  date +%s > "$dir/heartbeat.tmp" && mv "$dir/heartbeat.tmp" "$dir/heartbeat"
  sleep 1 & wait $!
done
"""

__all__ = ["GPU_MEMORY_GB", "Partition", "SlurmProvider", "check_job", "loss_reason", "parse_sinfo",
           "parse_test_only", "parse_time_limit", "slurm_minutes"]
