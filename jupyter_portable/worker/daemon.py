"""The agent process: the environment it scrubs, the heartbeat, serving the API (its
configuration and detaching: ``config``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop

from jupyter_portable.workdir.outside import write_outside_copy
from jupyter_portable.worker.activity import start_watchers
from jupyter_portable.worker.agent import prepare
from jupyter_portable.worker.api import MAX_BODY, make_app, shutdown_soon
from jupyter_portable.worker.config import check_config, machine_env
from jupyter_portable.worker.guardian import start_guardian
from jupyter_portable.worker.kernel import stop_kernel
from jupyter_portable.worker.protocol import READY_PREFIX
from jupyter_portable.worker.state import AgentState
from jupyter_portable.worker.warning import on_warning

log = logging.getLogger("jupyter_portable.worker")


def _heartbeat(state: AgentState, machine_pid: int | None) -> None:
    beat = state.state_dir / "heartbeat"
    while True:
        try:
            write_outside_copy(beat, f"{time.time():.3f}\n".encode())
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


def _scrub_environment(config: dict[str, Any], state_dir: Path) -> None:
    """This process's environment, which the kernel inherits: :func:`.config.machine_env`, the values the
    user's side sent (the store's settings, the names passed on purpose), and the store credentials
    only as a 0600 file botocore reads."""
    from jupyter_portable.core.secretenv import is_allowed, without_credentials
    from jupyter_portable.store.credentials import SessionCredentials, install

    keep, sent = machine_env(config)
    os.environ.clear()
    os.environ.update(keep)
    os.environ.update({k: v if k in sent else without_credentials(v) for k, v in (config.get("env") or {}).items()
                       if is_allowed(k) or k in sent})
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
    # tornado honours a body limit on the server, not the application's settings: past it a request is a
    # 400 read no further (and never buffered whole)
    server = HTTPServer(make_app(state), max_body_size=MAX_BODY, max_buffer_size=MAX_BODY)
    sockets = __import__("tornado.netutil", fromlist=["bind_sockets"]).bind_sockets(0, "127.0.0.1")
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    write_outside_copy(state.state_dir / "agent.json",
                 json.dumps({"pid": os.getpid(), "port": port, "allocation_id": state.allocation_id}).encode())
    ready_out.write(READY_PREFIX + json.dumps({"port": port, "pid": os.getpid(), "token": state.token}) + "\n")
    ready_out.close()  # whoever started the agent reads to the end of this pipe
    threading.Thread(target=_heartbeat, args=(state, config.get("machine_pid")), daemon=True).start()
    threading.Thread(target=prepare, args=(state,), daemon=True).start()
    start_watchers(state)
    state.guardian = start_guardian(state, config)

    def stop(_signum: int, _frame: object) -> None:
        IOLoop.current().add_callback_from_signal(shutdown_soon, state)

    signal.signal(signal.SIGTERM, stop)
    on_warning(state)  # the machine's warning that it ends soon: publish (worker/warning.py)
    IOLoop.current().start()
    stop_kernel(state)
    return 0


def run(config: dict[str, Any]) -> int:
    """The agent in this process (``config`` checked): the ready line on stdout, then everything
    it says to ``agent.log``."""
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
