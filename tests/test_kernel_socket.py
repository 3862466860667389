"""The server's kernel websocket after a move replaces the kernel's process (issue 30, item 6), through
a real Jupyter server with this extension and a real ipykernel, over the JSON protocol: the client
that reconnects hears the kernel's state at once ("starting" until the new process answers, then
"idle"), and "idle" for each request the replaced process never answered, but not for one the new
process has not finished yet. The browser side is
ui-tests/test_kernel_indicators.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

pytest_plugins = ["pytest_jupyter.jupyter_server"]


async def _socket(jp_ws_fetch: Any, kernel_id: str, session: str) -> Any:
    from jupyter_e2e import KernelSocket

    sock = KernelSocket(await jp_ws_fetch("api", "kernels", kernel_id, "channels", params={"session_id": session}))
    sock.session = session  # JupyterLab's client id, in the URL and in every header it sends
    return sock


async def _statuses_until(sock: Any, reply_to: str, timeout: float = 140) -> tuple[list[dict[str, Any]], str]:
    """Every status message up to (and a second after) the reply to ``reply_to``; the replying process's session."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    statuses: list[dict[str, Any]] = []
    session, answered = "", 0.0
    while True:
        left = (deadline if not session else min(deadline, answered + 1.0)) - loop.time()
        if left <= 0:
            if session:
                return statuses, session
            raise TimeoutError(f"no reply to {reply_to}; statuses {statuses}")
        try:
            raw = await asyncio.wait_for(sock.ws.read_message(), left)
        except TimeoutError:
            continue
        assert raw is not None, "the kernel websocket closed"
        msg = json.loads(raw)
        if msg["msg_type"] == "status":
            statuses.append(msg)
        elif msg["parent_header"].get("msg_id") == reply_to and msg["msg_type"].endswith("_reply") and not session:
            session, answered = msg["header"]["session"], loop.time()


@pytest.mark.timeout(180)
async def test_a_client_reconnecting_after_a_move_hears_the_state_and_idle_for_each_request_left(
        jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any) -> None:
    from jupyter_portable.orchestration.kernel_moves import drop_websockets, settle_execution_state

    km = jp_serverapp.kernel_manager
    kernel_id = json.loads((await jp_fetch("api", "kernels", method="POST",
                                           body=json.dumps({"name": "python3"}))).body)["id"]
    client = uuid.uuid4().hex
    sock = await _socket(jp_ws_fetch, kernel_id, client)
    await sock.nudge()
    running = await sock.execute("import time; time.sleep(120)")
    await sock.busy(running)
    queued = await sock.execute("print('queued')")

    # the move, as kernel_moves.restart_kernels does it: a plain restart, the state reset, the socket dropped
    await km.restart_kernel(kernel_id, now=True)
    settle_execution_state(km, kernel_id)
    assert drop_websockets(jp_serverapp, kernel_id) == 1

    sock = await _socket(jp_ws_fetch, kernel_id, client)
    # at once, before anything of the kernel's: its state as the server knows it, for no request
    first = json.loads(await asyncio.wait_for(sock.ws.read_message(), 30))
    assert (first["msg_type"], first["content"], first["parent_header"]) == (
        "status", {"execution_state": "starting"}, {}), first
    info = await sock.send("shell", "kernel_info_request", {})
    statuses, process = await _statuses_until(sock, info)
    left = {s["parent_header"].get("msg_id") for s in statuses if s["content"]["execution_state"] == "idle"}
    assert {running, queued} <= left, statuses
    # in the new process's session (JupyterLab drops a message of a session it no longer hears)
    assert all(s["header"]["session"] == process for s in statuses
               if s["parent_header"].get("msg_id") in (running, queued)), statuses
    # and the state once the new process answered: idle, for no request
    assert any(s["parent_header"] == {} and s["content"]["execution_state"] == "idle" for s in statuses), statuses

    # a request to the new process is not called finished before it is: its idle comes after its output
    late = await sock.execute("import time; time.sleep(2); print('done')")
    seen: list[str] = []
    while "idle" not in seen:
        msg = json.loads(await asyncio.wait_for(sock.ws.read_message(), 30))
        if msg["parent_header"].get("msg_id") == late:
            seen.append(msg["content"].get("execution_state") or msg["content"].get("text", "").strip())
    assert "done" in seen and seen.index("done") < seen.index("idle"), seen
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")


def test_a_starting_status_after_a_process_answered_is_not_forwarded_whoever_sent_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel process's "starting" that reaches a socket after a process answered through it, or
    after the socket told the kernel's state as it opened, is out of date (a browser run showed
    Idle, Starting, Idle): dropped, whichever process sent it; otherwise it is forwarded. The
    connection's outgoing side alone, fed the kernel's wire messages."""
    from jupyter_client.session import Session
    from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

    from jupyter_portable.interfaces.serverext.kernel_socket import PortableKernelConnection

    forwarded: list[tuple[str, str]] = []
    told: list[str] = []

    def forward(self: Any, stream: Any, msg_list: list[Any]) -> None:
        header, _parent, content = self._outgoing_parts(msg_list, status_only=True)
        forwarded.append((header["session"], content.get("execution_state", header["msg_type"])))

    monkeypatch.setattr(ZMQChannelsWebsocketConnection, "handle_outgoing_message", forward)
    monkeypatch.setattr(PortableKernelConnection, "_send_status",
                        lambda self, state, parent, kernel_session: told.append(state))
    key = b"k" * 16

    class Connection(PortableKernelConnection):  # the parts of a live connection the outgoing side reads
        session = Session(key=key)
        kernel_id = "kid"
        session_key = "kid:client"
        kernel_manager = type("KM", (), {"execution_state": "idle"})()

    conn = Connection.__new__(Connection)

    def wire(process: Session, state: str) -> list[bytes]:
        msg = process.msg("status", {"execution_state": state})
        return process.serialize(msg)

    old, new = Session(key=key), Session(key=key)
    conn.handle_outgoing_message("iopub", wire(new, "starting"))  # nothing told, nobody answered: forwarded
    conn.handle_outgoing_message("iopub", wire(new, "idle"))
    conn.handle_outgoing_message("iopub", wire(new, "starting"))  # the same process, late
    conn.handle_outgoing_message("iopub", wire(old, "starting"))  # another process's, late
    assert forwarded == [(new.session, "starting"), (new.session, "idle")], forwarded
    assert told == ["idle"]  # the socket's own status once the process answered

    # a socket that told the state as it opened: the new process's own "starting", its first
    # message, is not forwarded (it came after the left requests' "idle": Idle, Starting, Idle)
    forwarded.clear()
    told.clear()
    reopened = Connection.__new__(Connection)
    reopened._told_state = True
    reopened.handle_outgoing_message("iopub", wire(new, "starting"))
    reopened.handle_outgoing_message("iopub", wire(new, "idle"))
    assert forwarded == [(new.session, "idle")] and told == ["idle"], (forwarded, told)
