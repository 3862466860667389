"""The ssh provider against a real OpenSSH server on 127.0.0.1 (tests/sshd.py).

The "remote" host is this machine, so a test can look at the worker's files and process
directly; everything the provider does still goes through ssh. The host's GPU is the fake
``nvidia-smi`` of tests/fakegpu.py, put on the session PATH by the sshd's ``SetEnv``: the
provider itself knows nothing about tests.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import kill_worker_group
from fakegpu import H100, install_fake_nvidia_smi
from sshd import Sshd, keygen, running_sshd, unavailable

from jupyter_portable.compute.admission import probe_machine
from jupyter_portable.compute.base import Allocation, SshEndpoint
from jupyter_portable.compute.gpus import QUERY_ARGS, parse_query_csv
from jupyter_portable.compute.hosts import ENV_HOSTS, load_hosts, parse_hosts
from jupyter_portable.compute.ssh import ENV_STATE, SshProvider
from jupyter_portable.compute.sshlink import SshLink, ssh_runner
from jupyter_portable.core.errors import AuthError, LaunchFailed, NoCapacity, ProviderUnavailable, UsageError

pytestmark = pytest.mark.timeout(120)
DRIVER = "550.54.15"

HOSTS = """
[[host]]
name = "{name}"
host = "127.0.0.1"
port = {port}
user = "{user}"
key = "{key}"
workdir = "{workdir}"

[host.labels]
gpu = "NVIDIA H100 80GB HBM3"
gpu_count = 2
gpu_memory_gb = 80
driver = "550.54.15"
cuda = "12.4"
region = "loopback"
price_per_hour = 1.25
"""


def hosts_toml(path: Path, *, port: int, key: Path, workdir: Path, name: str = "box", user: str = "root") -> Path:
    path.write_text(HOSTS.format(name=name, port=port, user=user, key=key, workdir=workdir))
    return path


# -- the hosts file (no sshd needed) --------------------------------------------------------------


def test_hosts_file_lists_each_host_as_an_offer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = keygen(tmp_path / "id")
    monkeypatch.setenv(ENV_HOSTS, str(hosts_toml(tmp_path / "hosts.toml", port=2222, key=key, workdir=tmp_path)))
    monkeypatch.setenv(ENV_STATE, str(tmp_path / "state"))
    [offer] = SshProvider().offers()
    assert (offer.key, offer.gpu, offer.gpu_count, offer.gpu_memory_gb) == ("ssh/box", H100["name"], 2, 80)
    assert (offer.driver, offer.cuda, offer.region, offer.price_per_hour, offer.capacity) == (
        DRIVER, "12.4", "loopback", 1.25, 1)
    assert str(key) not in str(offer.to_json()) and str(key) not in str(offer.extra)


def test_a_missing_default_hosts_file_means_no_hosts_but_a_named_one_is_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_HOSTS, raising=False)
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "config"))
    assert load_hosts() == []
    monkeypatch.setenv(ENV_HOSTS, str(tmp_path / "nope.toml"))
    with pytest.raises(UsageError, match="does not exist"):
        load_hosts()


@pytest.mark.parametrize(("change", "message"), [
    (("port = 2222", "port = true"), "`port` must be an integer"),
    (("port = 2222", "port = 70000"), "not within 1..65535"),
    (('gpu_count = 2', 'gpu_count = 2\ncolor = "red"'), "unknown label"),
    (('user = "root"', 'user = "root"\npassword = "x"'), "unknown key"),
    (('gpu = "NVIDIA H100 80GB HBM3"', ''), "`gpu` is required"),
    (('host = "127.0.0.1"', 'host = "-oProxyCommand=x"'), "is not a host name"),
    (('name = "box"', 'name = "../box"'), "name must be"),
    (("price_per_hour = 1.25", "price_per_hour = -1"), "must not be negative"),
    (("[host.labels]", "[host.labelz]"), "unknown key"),
])
def test_a_bad_hosts_file_is_refused_with_a_clear_reason(tmp_path: Path, change: tuple[str, str],
                                                         message: str) -> None:
    key = keygen(tmp_path / "id")
    text = hosts_toml(tmp_path / "hosts.toml", port=2222, key=key, workdir=tmp_path).read_text()
    assert change[0] in text
    with pytest.raises(UsageError, match=message):
        parse_hosts(text.replace(change[0], change[1], 1))


def test_two_hosts_with_one_name_and_a_missing_key_file_are_refused(tmp_path: Path) -> None:
    key = keygen(tmp_path / "id")
    text = hosts_toml(tmp_path / "hosts.toml", port=2222, key=key, workdir=tmp_path).read_text()
    with pytest.raises(UsageError, match="used twice"):
        parse_hosts(text + text)
    with pytest.raises(UsageError, match="key file .* does not exist"):
        parse_hosts(text.replace(str(key), str(tmp_path / "missing")))


# -- against a real sshd on loopback -----------------------------------------------------------------


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("sshd")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    install_fake_nvidia_smi(bin_dir, [H100, H100], driver=DRIVER, cuda="12.4")
    with running_sshd(root / "server", path_prefix=[bin_dir]) as server:
        yield server
    assert server.proc.poll() is not None


@pytest.fixture
def provider(sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SshProvider]:
    monkeypatch.setenv(ENV_HOSTS, str(hosts_toml(tmp_path / "hosts.toml", port=sshd.port, key=sshd.client_key,
                                                 workdir=tmp_path / "remote", user=sshd.user)))
    monkeypatch.setenv(ENV_STATE, str(tmp_path / "state"))
    made = SshProvider(connect_timeout=5, stale_after=3)
    yield made
    # Leave no worker behind, whatever the test did.
    for rec_dir in (tmp_path / "remote" / "allocations").glob("*"):
        agent = rec_dir / "agent.json"
        if agent.exists() and not (rec_dir / "stopped").exists():
            kill_worker_group(agent)


def _alive(pid: int) -> bool:
    """Alive and not a zombie (nothing may reap an orphan quickly in a container)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _wait(predicate: object, seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_permission_is_checked_by_logging_in_and_the_host_key_is_pinned(provider: SshProvider, sshd: Sshd) -> None:
    [offer] = provider.offers()
    provider.check_permission(offer)
    pinned = provider.known_hosts.read_text()
    assert f"[127.0.0.1]:{sshd.port}" in pinned
    assert sshd.host_key.with_suffix(".pub").read_text().split()[1] in pinned


def test_a_wrong_key_is_an_auth_error_that_shows_no_key(provider: SshProvider, sshd: Sshd, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = keygen(tmp_path / "wrong")
    monkeypatch.setenv(ENV_HOSTS, str(hosts_toml(tmp_path / "wrong.toml", port=sshd.port, key=wrong,
                                                 workdir=tmp_path / "remote", user=sshd.user)))
    [offer] = provider.offers()
    with pytest.raises(AuthError) as info:
        provider.check_permission(offer)
    said = info.value.one_line()
    assert "refused the login" in said and "authorized_keys" in said
    secret = "".join(wrong.read_text().splitlines()[1:-1])
    for chunk in (secret[i:i + 16] for i in range(0, len(secret), 16)):
        assert chunk not in said


def test_a_changed_host_key_is_refused(provider: SshProvider, sshd: Sshd, tmp_path: Path) -> None:
    other = keygen(tmp_path / "impostor")
    kind, blob = other.with_suffix(".pub").read_text().split()[:2]
    provider.state_dir.mkdir(parents=True)
    provider.known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {kind} {blob}\n")
    [offer] = provider.offers()
    with pytest.raises(AuthError, match="host key") as info:
        provider.check_permission(offer)
    assert str(provider.known_hosts) in (info.value.hint or "")


def test_a_port_with_nothing_listening_is_unavailable_and_its_allocation_unknown_not_lost(
        sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    monkeypatch.setenv(ENV_HOSTS, str(hosts_toml(tmp_path / "h.toml", port=closed, key=sshd.client_key,
                                                 workdir=tmp_path)))
    provider = SshProvider(state_dir=tmp_path / "state", connect_timeout=3)
    [offer] = provider.offers()
    with pytest.raises(ProviderUnavailable, match="cannot be reached"):
        provider.check_permission(offer)
    gone = Allocation("a1", "ssh", "box", "box:1", "2024-01-01T00:00:00+00:00",
                      ssh=SshEndpoint("127.0.0.1", closed), details={"pid": 1, "remote_dir": str(tmp_path)})
    status = provider.status(gone)
    # an SSH error says nothing of the worker: core.reachability decides when silence is a loss (issue 42)
    assert status.state == "unknown" and "cannot be reached" in (status.reason or "")
    code, _out, err = ssh_runner(provider, gone)(["nvidia-smi"])  # a Runner answers, never raises
    assert code == 255 and "cannot be reached" in err


def test_the_ssh_provider_starts_a_worker_on_a_real_sshd_on_loopback(provider: SshProvider, sshd: Sshd,
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """ACCEPTANCE: The ssh provider starts a worker on a real sshd on loopback in CI."""
    [offer] = provider.offers()
    provider.check_permission(offer)
    assert provider.check_capacity(offer) == 1
    alloc = provider.launch(offer, allocation_id="alloc-1", env={"PORTABLE_TOKEN": "s3cr3t"})
    pid, remote = alloc.details["pid"], Path(alloc.details["remote_dir"])
    assert remote == tmp_path / "remote" / "allocations" / "alloc-1"
    assert alloc.ssh == SshEndpoint("127.0.0.1", sshd.port, sshd.user)
    # the worker runs there, detached from the SSH session that started it, and beats
    assert _alive(pid) and "alloc-1" in Path(f"/proc/{pid}/cmdline").read_text()
    assert os.getsid(pid) == pid
    first = float((remote / "heartbeat").read_text())
    assert _wait(lambda: float((remote / "heartbeat").read_text()) > first, 4)
    assert b"PORTABLE_TOKEN=s3cr3t" in Path(f"/proc/{pid}/environ").read_bytes()
    assert "s3cr3t" not in (provider.state_dir / "allocations.json").read_text()
    assert provider.status(alloc).state == "reachable"

    # the host is ours now: listed with no capacity, and a second launch is refused
    assert [o.capacity for o in provider.offers()] == [0]
    with pytest.raises(NoCapacity, match="alloc-1"):
        provider.check_capacity(offer)
    with pytest.raises(NoCapacity):
        provider.launch(offer, allocation_id="alloc-2")

    # admission's runner sees the host's GPU
    code, out, err = ssh_runner(provider, alloc)(["nvidia-smi", *QUERY_ARGS])
    assert code == 0, err
    gpus = parse_query_csv(out)
    assert [(g.name, g.driver) for g in gpus] == [(H100["name"], DRIVER)] * 2
    facts = probe_machine(ssh_runner(provider, alloc))
    assert (len(facts.gpus), facts.driver, facts.cuda_driver, facts.gpu_note) == (2, DRIVER, "12.4", None)
    assert provider.run(alloc, ["sh", "-c", "echo out; echo err >&2; exit 3"]) == (3, "out\n", "err\n")

    # a port on the host's loopback, reached through a forward on ours
    (remote / "www").mkdir()
    (remote / "www" / "hello.txt").write_text("hello from the host")
    # Without a terminal the remote server outlives its ssh client; it says its PID to be stopped by.
    server = subprocess.Popen(sshd.ssh_argv(f"cd {remote / 'www'} && echo $$ && "
                                            "exec python3 -u -m http.server --bind 127.0.0.1 0", provider.known_hosts),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert server.stdout is not None
    server_pid = server.stdout.readline().strip()
    try:
        remote_port = int(server.stdout.readline().split(" port ")[1].split()[0])
        local_port, close = provider.forward_port(alloc, remote_port)
        assert local_port != remote_port
        with urllib.request.urlopen(f"http://127.0.0.1:{local_port}/hello.txt", timeout=5) as answer:
            assert answer.read() == b"hello from the host"
        close()
        close()  # idempotent
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{local_port}/hello.txt", timeout=2)

        # a kernel's ports: several forwards through one connection (one ssh process), in order
        def tunnels() -> int:
            return sum(1 for c in psutil.Process().children() if c.name() == "ssh" and "-N" in c.cmdline())

        before = tunnels()
        ports, close = provider.forward_ports(alloc, [remote_port, remote_port, remote_port])
        assert len(set(ports)) == 3 and remote_port not in ports and tunnels() == before + 1
        for port in ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello.txt", timeout=5) as answer:
                assert answer.read() == b"hello from the host"
        # a tunnel whose connection ends by itself (a partition outlived its keepalive, the network
        # changed) comes back on the same local ports (issue 42): its clients reconnect where they were
        tunnel = close.__self__  # type: ignore[attr-defined]
        tunnel._proc.kill()
        assert _wait(lambda: tunnel.restarts == 1, 10)

        def answers(port: int) -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello.txt", timeout=2) as answer:
                    return answer.read() == b"hello from the host"
            except OSError:
                return False

        assert _wait(lambda: all(answers(port) for port in ports), 10)
        assert tunnels() == before + 1
        close()  # closed for good: not started again
        assert not _wait(lambda: tunnel.restarts > 1 or any(answers(port) for port in ports), 2)
        assert tunnels() == before
        for port in ports:
            with pytest.raises(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/hello.txt", timeout=2)
        with pytest.raises(UsageError, match="not within"):
            provider.forward_ports(alloc, [remote_port, 70000])

        # another process takes the free port before ssh binds it (a kernel started at the same
        # moment picks ports the same way): that process's socket answers a connection, but the
        # tunnel is not there; ssh cannot bind, exits, and another port is tried
        import jupyter_portable.compute.sshlink as ssh_module

        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", 0))
            squatter.listen()
            taken = squatter.getsockname()[1]
            real_free_port = ssh_module._free_port
            picks = iter([taken])
            monkeypatch.setattr(ssh_module, "_free_port", lambda: next(picks, None) or real_free_port())
            local_port, close = provider.forward_port(alloc, remote_port)
            assert local_port != taken
            with urllib.request.urlopen(f"http://127.0.0.1:{local_port}/hello.txt", timeout=5) as answer:
                assert answer.read() == b"hello from the host"
            close()
            # the same when only one port of several is taken: all are picked again
            picks = iter([real_free_port(), taken])
            ports, close = provider.forward_ports(alloc, [remote_port, remote_port])
            assert taken not in ports
            for port in ports:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello.txt", timeout=5) as answer:
                    assert answer.read() == b"hello from the host"
            close()
    finally:
        provider.run(alloc, ["kill", server_pid])
        server.wait(5)

    provider.terminate(alloc)
    assert _wait(lambda: not _alive(pid), 2)
    assert (remote / "stopped").exists()  # it was asked to stop (SIGTERM), not killed
    assert provider.status(alloc).state == "terminated"
    assert [o.capacity for o in provider.offers()] == [1]
    provider.terminate(alloc)  # already gone is not an error


def test_a_worker_killed_by_hand_is_lost_and_can_still_be_terminated(provider: SshProvider) -> None:
    [offer] = provider.offers()
    alloc = provider.launch(offer, allocation_id="alloc-k")
    os.kill(alloc.details["pid"], signal.SIGKILL)
    status = provider.status(alloc)
    assert status.state == "lost" and "gone" in (status.reason or "")
    assert [o.capacity for o in provider.offers()] == [0]  # lost is not released: it may still be running
    provider.terminate(alloc)
    assert provider.check_capacity(offer) == 1


def test_a_stale_heartbeat_of_a_live_worker_is_running_and_a_frozen_worker_is_killed(provider: SshProvider) -> None:
    [offer] = provider.offers()
    alloc = provider.launch(offer, allocation_id="alloc-s")
    pid = alloc.details["pid"]
    provider.stale_after = 1
    os.kill(pid, signal.SIGSTOP)
    time.sleep(provider.stale_after + 1)
    status = provider.status(alloc)
    # its process lives: the heartbeat path decides (core.reachability), not this one look
    assert status.state == "running" and "heartbeat" in (status.reason or "")
    provider.terminate(alloc, grace=0.5)
    assert _wait(lambda: not _alive(pid), 2)


def test_a_launch_that_cannot_start_the_worker_fails_and_frees_the_host(
        provider: SshProvider, sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (tmp_path / "hosts.toml").read_text().replace('workdir =', 'python = "no-such-python3"\nworkdir =')
    (tmp_path / "hosts.toml").write_text(text)
    [offer] = provider.offers()
    with pytest.raises(LaunchFailed, match="no-such-python3") as info:
        provider.launch(offer, allocation_id="alloc-f")
    assert "`python`" in (info.value.hint or "")
    assert provider.check_capacity(offer) == 1


def test_a_command_that_overruns_its_timeout_answers_124(provider: SshProvider) -> None:
    [offer] = provider.offers()
    code, _out, err = provider.run(offer, ["sleep", "3"], timeout=0.5)
    assert code == 124 and "timed out" in err


def test_a_cloud_machine_is_reached_the_same_way_as_an_ssh_host(tmp_path: Path, monkeypatch) -> None:
    """A provider without its own `run` (every cloud) is probed over SSH at its endpoint."""
    from fakegpu import H100, install_fake_nvidia_smi

    from jupyter_portable.compute.acquire import default_runner
    from jupyter_portable.compute.admission import probe_machine
    from jupyter_portable.compute.base import Allocation, Provider, SshEndpoint

    if unavailable():
        pytest.skip(unavailable())
    gpu_bin = tmp_path / "gpu-bin"
    install_fake_nvidia_smi(gpu_bin, [H100], driver="550.54.15", cuda="12.4")
    with running_sshd(tmp_path / "sshd", path_prefix=[gpu_bin]) as sshd:
        monkeypatch.setenv("JUPYTER_PORTABLE_SSH_KEY", str(sshd.client_key))
        monkeypatch.setenv("JUPYTER_PORTABLE_SSH_STATE", str(tmp_path / "state"))
        alloc = Allocation("al-cloud-1", "aws", "p5.48xlarge@us-east-1a", "i-0abc", "2026-11-30T00:00:00Z",
                           ssh=SshEndpoint(sshd.host, sshd.port, sshd.user))

        class Cloud(Provider):
            name = "aws"

        from jupyter_portable.compute.keys import pin_host_key

        # a machine whose host key is not pinned for this allocation is never talked to
        from jupyter_portable.core.errors import LaunchFailed

        with pytest.raises(LaunchFailed, match="no host key is pinned"):
            default_runner(Cloud(), alloc)
        # pinned to another key: ssh refuses (strict checking, this allocation's file alone)
        other = tmp_path / "other"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
        pin_host_key("al-cloud-1", sshd.host, sshd.port, other.with_suffix(".pub").read_text())
        rc, _, err = default_runner(Cloud(), alloc)(["true"])
        assert rc == 255 and "host key" in err
        pin_host_key("al-cloud-1", sshd.host, sshd.port, sshd.host_key.with_suffix(".pub").read_text())
        facts = probe_machine(default_runner(Cloud(), alloc))
        assert facts.driver == "550.54.15" and facts.gpus[0].name == H100["name"]


def test_a_cloud_machines_commands_share_one_connection_and_a_new_pin_gets_its_own(tmp_path: Path, monkeypatch
                                                                                     ) -> None:
    """The probe, the bootstrap and the worker's start log in once (OpenSSH's ControlMaster), in a
    private socket folder; the same IP:port pinned for another allocation never rides that connection."""
    from jupyter_portable.compute.acquire import cloud_ssh
    from jupyter_portable.compute.base import Allocation, SshEndpoint
    from jupyter_portable.compute.keys import pin_host_key
    from jupyter_portable.compute.sshlink import control_dir

    if unavailable():
        pytest.skip(unavailable())
    with running_sshd(tmp_path / "sshd") as sshd:
        monkeypatch.setenv("JUPYTER_PORTABLE_SSH_KEY", str(sshd.client_key))
        monkeypatch.setenv("JUPYTER_PORTABLE_SSH_STATE", str(tmp_path / "state"))

        def logins() -> int:
            return sshd.log_text().count("Accepted publickey")

        def machine(aid: str) -> tuple[SshLink, Allocation]:
            pin_host_key(aid, sshd.host, sshd.port, sshd.host_key.with_suffix(".pub").read_text())
            ssh, shim = cloud_ssh(Allocation(aid, "runpod", "H100@x", "pod-1", "2026-11-30T00:00:00Z",
                                             ssh=SshEndpoint(sshd.host, sshd.port, sshd.user)))
            return ssh, shim

        ssh, shim = machine("al-share-1")
        assert ssh.multiplex
        for i in range(4):
            code, out, _ = ssh.run(shim, ["echo", f"call-{i}"])
            assert (code, out.strip()) == (0, f"call-{i}")
        code, data, _ = ssh.exec_bytes(shim, "cat", b"bytes both ways", 20)
        assert (code, data) == (0, b"bytes both ways")
        assert _wait(lambda: logins() >= 1, 10)
        assert logins() == 1, sshd.log_text()
        folder = control_dir()
        assert folder is not None and (os.stat(folder).st_mode & 0o777) == 0o700
        other, other_shim = machine("al-share-2")  # a later rental on the same endpoint
        assert other.run(other_shim, ["true"])[0] == 0
        assert _wait(lambda: logins() >= 2, 10) and logins() == 2


def test_a_keepalive_that_is_not_whole_seconds_and_a_count_is_refused(tmp_path: Path) -> None:
    for bad in ((0, 3), (10, 0), (1.5, 2)):
        with pytest.raises(UsageError, match="keepalive"):
            SshLink([], state_dir=tmp_path, keepalive=bad)  # type: ignore[arg-type]
    assert SshLink([], state_dir=tmp_path, keepalive=(1, 2)).keepalive == (1, 2)
