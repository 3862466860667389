"""A real one-node Slurm cluster on this machine for tests: ``munged``, ``slurmctld`` and ``slurmd``
(Debian's ``slurm-wlm`` and ``munge``), each a child of the test, with everything they write in one
folder of its own and ports of their own, so two pytest-xdist workers each run a cluster side by side.

Two partitions share the node: ``batch`` (the default) and ``urgent``, whose higher PriorityTier
preempts ``batch`` jobs (``PreemptType=preempt/partition_prio``, ``PreemptMode=REQUEUE``: a job that
may be requeued is, one that may not is ended as PREEMPTED). The node has two GPUs declared as GRES
(``gpu:a100:2``) with ``AutoDetect=off`` and placeholder device files; nothing reads them.

The Slurm commands find this cluster through ``SLURM_CONF`` (:attr:`SlurmCluster.env`); a login
node's sshd must pass it on to its sessions (``start_sshd(env=cluster.env)``). Needs root::

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with running_cluster(tmp_path) as cluster:
        subprocess.run(["sinfo"], env={**os.environ, **cluster.env}, check=True)
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
COMMANDS = ("sinfo", "sbatch", "squeue", "scancel", "scontrol")
GPUS = 2
GPU_TYPE = "a100"


def unavailable() -> str | None:
    """Why a real Slurm cluster cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "a test Slurm cluster needs root (slurmd runs jobs as their users); CI runs as root"
    missing = [p for p in DAEMONS if not os.path.exists(p)] + [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)}): apt-get install -y slurm-wlm munge"
    return None


@dataclass
class SlurmCluster:
    """A running cluster: its folder, its config, its node and how to reach its commands."""

    dir: Path
    conf: Path
    node: str
    ctld_port: int
    slurmd_port: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach this cluster with the Slurm commands."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster, as root on this machine (the admin's side)."""
        return subprocess.run(list(argv), env={**os.environ, **self.env}, capture_output=True, text=True,
                              check=check, timeout=timeout)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.dir.glob("*.log")))

    def node_state(self) -> str:
        """The node's state as sinfo says it (one line a partition, all alike)."""
        lines = self.run("sinfo", "-h", "-N", "-n", self.node, "-o", "%T", check=False).stdout.split()
        return lines[0] if lines else ""

    def stop(self) -> None:
        """Stop the daemons by their PIDs (slurmd first), then the jobs' leftover processes."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(3)  # a daemon still ending jobs is killed: the cluster's folder goes with the test
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


def _free_ports(count: int) -> list[int]:
    socks, ports = [], []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        socks.append(sock)
        ports.append(int(sock.getsockname()[1]))
    for sock in socks:
        sock.close()
    return ports


def write_config(directory: Path, *, node: str, ctld_port: int, slurmd_port: int, cpus: int = 4,
                 max_time: str = "2:00:00") -> Path:
    """slurm.conf, gres.conf and cgroup.conf in ``directory``; the path of slurm.conf."""
    host = socket.gethostname()
    for i in range(GPUS):  # placeholder device files (like /dev/null): AutoDetect=off reads nothing
        device = directory / f"nvidia{i}"
        if not device.exists():
            os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    (directory / "gres.conf").write_text(
        "AutoDetect=off\n"
        f"NodeName={node} Name=gpu Type={GPU_TYPE} File={directory}/nvidia[0-{GPUS - 1}]\n")
    (directory / "cgroup.conf").write_text("CgroupAutomount=no\nConstrainDevices=no\n")
    for sub in ("state", "spool"):
        (directory / sub).mkdir(exist_ok=True)
    conf = directory / "slurm.conf"
    conf.write_text("\n".join([
        f"ClusterName={node}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={directory}/munge.socket",
        f"StateSaveLocation={directory}/state",
        f"SlurmdSpoolDir={directory}/spool",
        f"SlurmctldPidFile={directory}/slurmctld.pid",
        f"SlurmdPidFile={directory}/slurmd.pid",
        f"SlurmctldLogFile={directory}/slurmctld.log",
        f"SlurmdLogFile={directory}/slurmd.log",
        "SlurmctldDebug=info", "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none", "ReturnToService=2",
        "SchedulerType=sched/backfill", "SchedulerParameters=sched_interval=1,bf_interval=1",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",  # the node declares what this machine may not have
        "PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE",
        "GresTypes=gpu",
        "MinJobAge=600",  # ended jobs stay visible to squeue while the tests look
        "KillWait=2", "OverTimeLimit=0", "InactiveLimit=0", "MessageTimeout=10",
        "SlurmctldTimeout=30", "SlurmdTimeout=60",
        f"NodeName={node} NodeAddr=127.0.0.1 NodeHostname={host} CPUs={cpus} RealMemory=1000 "
        f"Gres=gpu:{GPU_TYPE}:{GPUS} State=UNKNOWN",
        f"PartitionName=batch Nodes={node} Default=YES MaxTime={max_time} PriorityTier=1 State=UP",
        f"PartitionName=urgent Nodes={node} MaxTime={max_time} PriorityTier=10 State=UP",
    ]) + "\n")
    return conf


def _start(argv: list[str], *, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def _wait(predicate: object, timeout: float, what: str, cluster: SlurmCluster | None = None) -> None:
    """Poll ``predicate`` every 0.2 s, at most ``timeout`` seconds' worth of tries (no clock is read)."""
    for _ in range(max(1, round(timeout / 0.2))):
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise RuntimeError(f"test Slurm cluster: {what} after {timeout:g}s\n{cluster.logs() if cluster else ''}")


def start_cluster(directory: Path, *, timeout: float = 60) -> SlurmCluster:
    """Write the config and start munged, slurmctld and slurmd in ``directory``; return once the node is idle."""
    directory.mkdir(parents=True, exist_ok=True)
    node = "jp" + secrets.token_hex(3)
    ctld_port, slurmd_port = _free_ports(2)
    conf = write_config(directory, node=node, ctld_port=ctld_port, slurmd_port=slurmd_port)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    key = directory / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o600)
    cluster = SlurmCluster(dir=directory, conf=conf, node=node, ctld_port=ctld_port, slurmd_port=slurmd_port)
    try:
        socket_path = directory / "munge.socket"
        cluster.procs.append(_start(
            ["/usr/sbin/munged", "--foreground", "--force", f"--socket={socket_path}", f"--key-file={key}",
             f"--pid-file={directory / 'munged.pid'}", f"--log-file={directory / 'munged.log'}",
             f"--seed-file={directory / 'munge.seed'}"], env=env, log=directory / "munged.out.log"))
        _wait(socket_path.exists, timeout, "munged did not make its socket", cluster)
        cluster.procs.append(_start(["/usr/sbin/slurmctld", "-D", "-i", "-f", str(conf)], env=env,
                                    log=directory / "slurmctld.out.log"))
        cluster.procs.append(_start(["/usr/sbin/slurmd", "-D", "-N", node, "-f", str(conf)], env=env,
                                    log=directory / "slurmd.out.log"))
        _wait(lambda: cluster.node_state() == "idle", timeout, "the node is not idle", cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def running_cluster(directory: Path, *, timeout: float = 60) -> Iterator[SlurmCluster]:
    """A cluster for the length of the block, stopped afterwards."""
    cluster = start_cluster(directory, timeout=timeout)
    try:
        yield cluster
    finally:
        cluster.stop()
