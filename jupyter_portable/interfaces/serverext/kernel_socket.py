"""The notebook's kernel websocket, telling JupyterLab what it cannot learn after a reconnect.

A move (docs/continue.md) restarts the notebook's kernel as a new process, on the new machine or
as the local placeholder, and drops its websockets; JupyterLab reconnects to the same kernel id.
Two things then went wrong in JupyterLab's own widgets (issue 30, item 6):

- **The status bar said "Unknown".** JupyterLab sets the kernel's status to "unknown" while its
  socket is down, and counts no status caused by a message type in the server's
  ``untracked_message_types`` (kernel_info_request, comm_info_request): that is all a reconnect
  exchanges, so "Unknown" stayed until the next cell ran. As a socket opens, this connection
  sends one status with the server's record of the kernel's state (the kernel manager's
  ``execution_state``, the one ``/api/kernels`` shows; a moved kernel's is "starting" until it
  answers, orchestration/kernel_moves.py) before any of the kernel's messages, and the state
  again ("idle" unless a cell runs) after the first message the kernel sends through it. A
  process's own "starting" (sent once, as it starts) is then not forwarded: it says nothing
  the socket has not said, and arriving after the "idle" of the requests the old process left
  (below), or after a process answered, it showed Starting again until a cell ran.
- **The toolbar's execution indicator stayed "Executed 3/4 cells".** It counts each
  execute_request until its "idle" status; the cells held by the placeholder during a Continue,
  or queued behind a cell on a machine that was lost, were sent to a process that ended without
  answering them. Each execute_request a client sends is remembered with the kernel process that
  answered last (the session id in its messages' headers); when another process answers that
  client, each request the old one left is told "idle", as that process would have said had it
  finished. The notebook plugin runs held cells again as new requests.

A kernel on a machine reached through SSH forwards misses what it publishes while a forward is
down (a partition): each socket passes on, before the first message after a forward came back,
what the worker recorded since the last message it passed on, each message once
(``worker/catchup.py``, ``worker/iopub_log.py``).

Both statuses carry the session id of the kernel process last heard, so JupyterLab (which drops
a message whose session is not the one it heard last) drops none of the kernel's own messages
around them.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from jupyter_client.jsonutil import json_default
from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection
from tornado.websocket import WebSocketClosedError

from jupyter_portable.worker.catchup import CatchUp

V1 = "v1.kernel.websocket.jupyter.org"
# the states a client is told as the server knows them ("starting": a new process that has not
# answered yet; "dead" is JupyterLab's own to decide, it disposes the connection)
TOLD_STATES = ("idle", "busy", "starting")
# how many unfinished requests one client's entry keeps (a client that never reconnects leaves its own)
MAX_UNFINISHED = 10_000


class PortableKernelConnection(ZMQChannelsWebsocketConnection):  # type: ignore[misc]
    """jupyter_server's kernel websocket, plus the two statuses of the module docstring."""

    # by session key (kernel id:client session): execute_request msg_id -> (its header, the kernel
    # process's session when it was sent, '' when none had answered yet)
    _unfinished: ClassVar[dict[str, dict[str, tuple[dict[str, Any], str]]]] = {}
    # kernel id -> the session id of the last message its process sent
    _kernel_sessions: ClassVar[dict[str, str]] = {}

    def handle_incoming_message(self, incoming_msg: Any) -> None:
        header, channel = self._incoming_header(incoming_msg)
        if channel == "shell" and header.get("msg_type") == "execute_request" and header.get("msg_id"):
            mine = self._unfinished.setdefault(self.session_key, {})
            if len(mine) < MAX_UNFINISHED:
                mine[str(header["msg_id"])] = (header, self._kernel_sessions.get(self.kernel_id, ""))
        super().handle_incoming_message(incoming_msg)

    def handle_outgoing_message(self, stream: Any, outgoing_msg: list[Any]) -> None:
        channel = stream if isinstance(stream, str) else getattr(stream, "channel", None)
        catchup = self._catchup() if channel == "iopub" else None
        if catchup is None:
            self._pass_on(stream, outgoing_msg)
            return
        header, _, _ = self._outgoing_parts(outgoing_msg, status_only=True)
        # what the kernel published while the SSH forward was down, from the worker, before this
        # message; nothing twice (worker/catchup.py)
        for frames in catchup.passing(str(header.get("msg_id") or "")):
            self._pass_on(stream, outgoing_msg if frames is None else frames)

    def _catchup(self) -> CatchUp | None:
        """This socket's CatchUp, for a kernel on a machine reached through SSH forwards; else None."""
        client = getattr(getattr(self.kernel_manager, "provisioner", None), "agent_client", None)
        if client is None or client.record.allocation.ssh is None:
            return None
        held = getattr(self, "_catchup_of", None)
        if held is None or held[0] is not client:  # a kernel restarted or moved: a new connection to follow
            held = (client, CatchUp(lambda after: client.iopub_after(after, timeout=3), client.forward_restarts))
            self._catchup_of = held
        return held[1]

    def _pass_on(self, stream: Any, outgoing_msg: list[Any]) -> None:
        channel = stream if isinstance(stream, str) else getattr(stream, "channel", None)
        header, parent, content = self._outgoing_parts(outgoing_msg, status_only=True)
        kernel_session = str(header.get("session") or "")
        if kernel_session:
            self._kernel_sessions[self.kernel_id] = kernel_session
            self._finish_left_requests(kernel_session)
        state = content.get("execution_state") if channel == "iopub" and header.get("msg_type") == "status" else None
        if state == "idle":
            self._unfinished.get(self.session_key, {}).pop(str(parent.get("msg_id") or ""), None)
        if state == "starting" and (getattr(self, "_answered_by", "") or getattr(self, "_told_state", False)):
            # a process's own "starting" (sent once, as it starts) says nothing this socket has not
            # said: it told the state as it opened, and tells it again after a new process's first
            # message. Forwarded, it came after the "idle" of the requests the old process left, or
            # after a process answered, and JupyterLab showed Starting again (until a cell ran)
            return
        super().handle_outgoing_message(stream, outgoing_msg)
        if kernel_session and getattr(self, "_answered_by", "") != kernel_session:
            # this process answers through this socket, so it has started, whatever the server last heard
            self._answered_by = kernel_session
            busy = getattr(self.kernel_manager, "execution_state", None) == "busy"
            self._send_status("busy" if busy else "idle", None, kernel_session)

    def connect(self) -> Any:
        connected = super().connect()
        state = getattr(self.kernel_manager, "execution_state", None)
        if connected is not None and state in TOLD_STATES:
            # at once, before the server's nudge of the kernel lets any of its messages through
            self._send_status(str(state), None, self._kernel_sessions.get(self.kernel_id, ""))
            self._told_state = True
        return connected

    def disconnect(self) -> None:  # type: ignore[override]  # ZMQChannelsWebsocketConnection's is not async
        super().disconnect()
        if self.kernel_id not in self.multi_kernel_manager:  # shut down: nobody reconnects to it
            self._kernel_sessions.pop(self.kernel_id, None)
            for key in [k for k in self._unfinished if k.startswith(f"{self.kernel_id}:")]:
                self._unfinished.pop(key, None)

    def _finish_left_requests(self, kernel_session: str) -> None:
        """Tell this client "idle" for each of its requests that another kernel process left."""
        mine = self._unfinished.get(self.session_key)
        if not mine:
            return
        for msg_id, (header, sent_to) in list(mine.items()):
            if not sent_to:
                mine[msg_id] = (header, kernel_session)  # sent before any process answered: this one has it
            elif sent_to != kernel_session:
                del mine[msg_id]
                self._send_status("idle", header, kernel_session)

    def _send_status(self, state: str, parent: dict[str, Any] | None, kernel_session: str) -> None:
        msg = self.session.msg("status", {"execution_state": state}, parent=parent or {})
        msg["header"]["session"] = kernel_session
        try:
            if self.subprotocol == V1:
                self.write_message(serialize_msg_to_ws_v1(msg, "iopub", self.session.pack), binary=True)
            else:
                msg["channel"] = "iopub"
                self.write_message(json.dumps(msg, default=json_default))
        except WebSocketClosedError as exc:
            self.log.debug("jupyter-portable: status %s not sent to a closed websocket: %s", state, exc)

    def _incoming_header(self, ws_msg: Any) -> tuple[dict[str, Any], str]:
        """(header, channel) of a message from the client; ({}, '') for one the base class refuses."""
        try:
            if self.subprotocol == V1:
                channel, parts = deserialize_msg_from_ws_v1(ws_msg)
                header = self.session.unpack(parts[0])
            else:
                msg = deserialize_binary_message(ws_msg) if isinstance(ws_msg, bytes) else json.loads(ws_msg)
                channel, header = msg.get("channel") or "shell", msg.get("header")
        except (ValueError, IndexError, TypeError, AttributeError):
            return {}, ""  # the base class logs and ignores what it cannot read
        return (header if isinstance(header, dict) else {}), str(channel)

    def _outgoing_parts(self, msg_list: list[Any], status_only: bool) -> tuple[dict[str, Any], ...]:
        """(header, parent header, content) of a kernel's message; parent and content only of a status."""
        try:
            _, fed = self.session.feed_identities(msg_list)
            header = self.session.unpack(_bytes(fed[1]))
            if status_only and header.get("msg_type") != "status":
                return header, {}, {}
            return header, self.session.unpack(_bytes(fed[2])), self.session.unpack(_bytes(fed[4]))
        except (ValueError, IndexError, TypeError, AttributeError):
            return {}, {}, {}  # forwarded as it is: the base class reports a malformed message


def _bytes(part: Any) -> bytes:
    return part.bytes if hasattr(part, "bytes") else bytes(part)


def install(serverapp: Any) -> bool:
    """Serve kernel websockets with PortableKernelConnection, unless another class was configured."""
    settings = serverapp.web_app.settings
    current = settings.get("kernel_websocket_connection_class")
    if current not in (None, ZMQChannelsWebsocketConnection):
        serverapp.log.info("jupyter-portable: kernel websockets stay %s (configured)", current)
        return False
    settings["kernel_websocket_connection_class"] = PortableKernelConnection
    serverapp.kernel_websocket_connection_class = PortableKernelConnection
    return True


__all__ = ["PortableKernelConnection", "install"]
