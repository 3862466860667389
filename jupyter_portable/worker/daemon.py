"""The agent process: its configuration on stdin, the environment it scrubs, the heartbeat,
serving the API, and detaching from the process that started it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop

from jupyter_portable.core.errors import UsageError
from jupyter_portable.workdir.files import atomic_write
from jupyter_portable.worker.activity import start_watchers
from jupyter_portable.worker.agent import prepare
from jupyter_portable.worker.api import make_app, shutdown_soon
from jupyter_portable.worker.kernel import stop_kernel
from jupyter_portable.worker.protocol import READY_PREFIX
from jupyter_portable.worker.state import AgentState

log = logging.getLogger("jupyter_portable.worker")


def _heartbeat(state: AgentState, machine_pid: int | None) -> None:
    beat = state.state_dir / "heartbeat"
    while True:
        try:
            atomic_write(beat, f"{time.time():.3f}\n".encode())
        except OSError:
            if not state.state_dir.exists():  # the machine's folder is gone: so is the machine
                log.warning("the allocation's folder %s is gone: stopping", state.state_dir)
                state.machine_gone = True
                stop_kernel(state, timeout=1)
                os._exit(3)
        if machine_pid is not None and not _alive(machine_pid):
            log.warning("the machine's process %d is gone: stopping", machine_pid)
            state.machine_gone = True
            stop_kernel(state, timeout=1)
            os._exit(3)
        time.sleep(1.0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rpartition(")")[2].split()[:1] == ["Z"]:
            return False
    return True


def check_config(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise UsageError("the agent's configuration must be a JSON object")
    for key in ("store", "workspace_id", "allocation_id", "workdir", "state_dir"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise UsageError(f"the agent's configuration needs {key!r}")
    for key in ("version", "epoch"):
        if not isinstance(obj.get(key), int) or obj[key] < 0:
            raise UsageError(f"the agent's configuration needs a non-negative integer {key!r}")
    environment = obj.get("environment") or {"mode": "image"}
    if not isinstance(environment, dict) or environment.get("mode") not in ("auto", "image", "lockfile", "exact"):
        raise UsageError('environment must be {"mode": "auto"}, {"mode": "image"}, {"mode": "exact"} or '
                         '{"mode": "lockfile", ...}')
    env = obj.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise UsageError("env must map names to text")
    if obj.get("pass_env") is not None:
        from jupyter_portable.core.secretenv import pass_names

        if not isinstance(obj["pass_env"], list):
            raise UsageError("pass_env must be a list of variable names")
        obj["pass_env"] = list(pass_names(obj["pass_env"], "pass_env"))
    if obj.get("credentials") is not None:
        from jupyter_portable.store.credentials import SessionCredentials

        SessionCredentials.from_json(obj["credentials"])
    return obj


def _machine_env(config: dict[str, Any]) -> tuple[dict[str, str], set[str]]:
    """What of this machine's environment the worker keeps: what core.secretenv allows, and the
    names passed on purpose (the user's ``pass_env`` and the machine's own
    ``JUPYTER_PORTABLE_PASS_ENV``); with the user's names."""
    from jupyter_portable.core.secretenv import PASS_ENV, pass_names, scrubbed

    sent = set(config.get("pass_env") or ())
    try:
        own = set(pass_names(os.environ.get(PASS_ENV), f"the machine's {PASS_ENV}"))
    except UsageError:
        own = set()  # the machine's own setting is unreadable: it keeps nothing beyond the allow-list
    return scrubbed(os.environ, sent | own), sent


def _scrub_environment(config: dict[str, Any], state_dir: Path) -> None:
    """This process's environment, which the kernel inherits: :func:`_machine_env`, the values the
    user's side sent (the store's settings, the names passed on purpose), and the store credentials
    only as a 0600 file botocore reads."""
    from jupyter_portable.core.secretenv import is_allowed
    from jupyter_portable.store.credentials import SessionCredentials, install

    keep, sent = _machine_env(config)
    os.environ.clear()
    os.environ.update(keep)
    os.environ.update({k: v for k, v in (config.get("env") or {}).items() if is_allowed(k) or k in sent})
    if config.get("credentials") is not None:
        os.environ.update(install(state_dir / "aws", SessionCredentials.from_json(config["credentials"])))


def serve(config: dict[str, Any], ready_out: Any) -> int:
    config = check_config(config)
    state = AgentState(config)
    state.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    _scrub_environment(config, state.state_dir)
    if config.get("credentials") is not None:
        state.credentials_expiration = str(config["credentials"]["Expiration"])
    state.workdir.mkdir(parents=True, exist_ok=True)
    asyncio.set_event_loop(asyncio.new_event_loop())
    server = HTTPServer(make_app(state))
    sockets = __import__("tornado.netutil", fromlist=["bind_sockets"]).bind_sockets(0, "127.0.0.1")
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    atomic_write(state.state_dir / "agent.json",
                 json.dumps({"pid": os.getpid(), "port": port, "allocation_id": state.allocation_id}).encode())
    ready_out.write(READY_PREFIX + json.dumps({"port": port, "pid": os.getpid(), "token": state.token}) + "\n")
    ready_out.close()  # whoever started the agent reads to the end of this pipe
    threading.Thread(target=_heartbeat, args=(state, config.get("machine_pid")), daemon=True).start()
    threading.Thread(target=prepare, args=(state,), daemon=True).start()
    start_watchers(state)

    def stop(_signum: int, _frame: object) -> None:
        IOLoop.current().add_callback_from_signal(shutdown_soon, state)

    signal.signal(signal.SIGTERM, stop)
    IOLoop.current().start()
    stop_kernel(state)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_portable.worker",
                                     description="the jupyter-portable worker agent (configuration on stdin)")
    parser.add_argument("--detach", action="store_true",
                        help="start the agent in a session of its own, print its ready line, and return")
    args = parser.parse_args(argv)
    raw = sys.stdin.read()
    try:
        config = check_config(json.loads(raw))
    except (ValueError, UsageError) as exc:
        print(f"jupyter-portable worker: bad configuration: {exc}", file=sys.stderr)
        return 2
    if args.detach:
        return _detach(raw, Path(config["state_dir"]).expanduser(), _machine_env(config)[0])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # the ready line goes to the parent's pipe; everything after it to the log
    ready = os.fdopen(os.dup(1), "w")
    state_dir = Path(config["state_dir"]).expanduser()
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(state_dir / "agent.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return serve(config, ready)


def _detach(raw: str, state_dir: Path, env: dict[str, str], timeout: float = 60.0) -> int:
    # started with only what it keeps: what the worker drops is not left in its /proc/PID/environ either
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_portable.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(raw.encode())
    proc.stdin.close()
    deadline = time.monotonic() + timeout
    line = b""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(READY_PREFIX.encode()) or not line:
            break
    if not line.startswith(READY_PREFIX.encode()):
        tail = ""
        with contextlib.suppress(OSError):
            tail = (state_dir / "agent.log").read_text(errors="replace")[-800:]
        print(f"jupyter-portable worker: the agent did not come up: {tail}", file=sys.stderr)
        return 1
    sys.stdout.write(line.decode())
    sys.stdout.flush()
    return 0
