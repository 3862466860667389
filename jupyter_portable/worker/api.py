"""The worker agent's HTTP API: a tornado app on the machine's loopback only, every request
carrying the per-allocation token.

The server extension's boundary style: each body is checked against its schema
(``worker/schemas``, by ``core.bodies``), a handler raises the package's typed errors and never
answers an error itself, and an error's status and answer ``{"error", "hint"}`` are the ones
the server gives (``core.http_status``). The routes are one table, :data:`ROUTES`.

API (JSON; ``Authorization: token <token>``)::

    GET  /status                    phase, version, epoch, verification, progress, pending files
    POST /kernel   {"kernel_id"}    start (or restart) the kernel; its connection info (ports on 127.0.0.1)
    GET  /kernel                    {"alive": bool, "returncode": int | null}
    POST /kernel/signal {"signum"}  signal the kernel
    GET  /kernel/iopub?after=<msg_id>  {"kernel", "found", "messages"}: what the kernel published after it
    DELETE /kernel                  stop the kernel
    POST /snapshot {"message"}      publish the worker's copy: {"version", "changed"}
    PUT  /files {"path", "content" (base64), "base" (hash or null)}   409 on a conflicting edit
    GET  /files                     the copy's files (path, size) and what is still pending
    POST /fetch {"path"}            fetch a pending large file now
    GET  /tree                      the copy's files with their hashes (worker/follow.py): what the
                                    user's file browser follows
    POST /read {"path"}             one file's bytes: {"path", "hash", "size", "content" (base64)}
    POST /seal {"message"}          seal: {"version", "manifest"}
    PUT  /credentials {credential_process JSON}   fresh store credentials: {"expiration"}
    POST /activity {}               "Keep running": the idle clock starts again now: {"kept_at"}
    POST /shutdown                  stop the kernel and exit
"""

from __future__ import annotations

import base64
import binascii
import errno
import functools
import hmac
import json
import signal
from pathlib import Path
from typing import Any

from tornado import web
from tornado.ioloop import IOLoop

from jupyter_portable.core.bodies import SchemaSet
from jupyter_portable.core.errors import ConflictError, UsageError
from jupyter_portable.core.http_status import error_answer, status_for
from jupyter_portable.core.paths import check_relpath
from jupyter_portable.core.validate import short_repr
from jupyter_portable.workdir.workcopy import WorkspaceCopy
from jupyter_portable.worker.agent import check_fits, list_files, put_file, seal, take_snapshot
from jupyter_portable.worker.follow import FileHashes, read_file
from jupyter_portable.worker.kernel import start_watched_kernel, stop_kernel
from jupyter_portable.worker.state import AgentState

_REQUEST_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR, errno.EISDIR})
MAX_BODY = 64 * 2**20  # an edit saved in JupyterLab; large data goes through the store (daemon's HTTPServer)
SCHEMA_DIR = Path(__file__).parent / "schemas"


@functools.cache
def schemas() -> SchemaSet:
    """Every schema of the worker's API, read once."""
    return SchemaSet({p.name: json.loads(p.read_text()) for p in sorted(SCHEMA_DIR.glob("*.json"))})


class _Handler(web.RequestHandler):
    state: AgentState

    def initialize(self, state: AgentState) -> None:
        self.state = state

    def prepare(self) -> None:
        given = self.request.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "token" or not hmac.compare_digest(token.encode(), self.state.token.encode()):
            raise web.HTTPError(403, reason="a valid token is required")
        if self.state.guardian is not None:
            self.state.guardian.heard()  # the user side is there (worker/guardian)

    def checked_body(self, schema: str) -> dict[str, Any]:
        """The body (none: ``{}``), strict and checked against ``worker/schemas/<schema>``: a 400 naming
        the field it refuses."""
        return schemas().read_body(self.request.body, schema)

    def answer(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        reason = exc.reason if isinstance(exc, web.HTTPError) and exc.reason else self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(error_answer(exc, reason)))

    def _handle_request_exception(self, e: BaseException) -> None:
        # the server's table (core.http_status); anything else stays a 500 with its traceback logged
        status = status_for(e)
        if status is not None and status != 500 and not self._finished:
            self.send_error(status, exc_info=(type(e), e, e.__traceback__))
            return
        super()._handle_request_exception(e)

    async def run(self, fn: Any, *args: Any) -> None:
        """``fn(*args)`` off the loop, its result the answer; what it raises is the answer's error."""
        try:
            result = await IOLoop.current().run_in_executor(None, fn, *args)
        except OSError as exc:
            if exc.errno not in _REQUEST_ERRNOS:
                raise
            # a path the request named that this filesystem cannot hold or follow
            raise UsageError(f"{exc.strerror}: {short_repr(exc.filename or '')}") from exc
        self.answer(result)


class StatusHandler(_Handler):
    def get(self) -> None:
        self.answer(self.state.status())


class KernelHandler(_Handler):
    async def post(self) -> None:
        kernel_id = self.checked_body("kernel-request.json").get("kernel_id") or "kernel"
        if self.state.phase != "ready":
            raise ConflictError(f"the worker is {self.state.phase}, not ready")
        await self.run(start_watched_kernel, self.state, kernel_id)

    def get(self) -> None:
        self.answer(self.state.kernel_status())

    async def delete(self) -> None:
        self.checked_body("empty-request.json")

        def stop() -> dict[str, Any]:
            stop_kernel(self.state)
            return {"stopped": True}

        await self.run(stop)


class KernelSignalHandler(_Handler):
    def post(self) -> None:
        signum = self.checked_body("signal-request.json")["signum"]
        if signum not in {s.value for s in signal.Signals}:
            raise UsageError(f"signum must be a signal number, not {signum}")
        k = self.state.kernel
        if k is None or k.poll() is not None:
            raise ConflictError("no kernel is running")
        k.send_signal(signum)
        self.answer({"sent": signum})


class SnapshotHandler(_Handler):
    async def post(self) -> None:
        message = self.checked_body("snapshot-request.json").get("message") or ""
        await self.run(take_snapshot, self.state, message)


class FilesHandler(_Handler):
    async def get(self) -> None:
        await self.run(list_files, self.state)

    async def put(self) -> None:
        body = self.checked_body("files-request.json")
        try:
            data = base64.b64decode(body["content"], validate=True)
        except (binascii.Error, ValueError):
            raise UsageError("content must be the file's bytes in base64") from None
        await self.run(put_file, self.state, body["path"], data, body.get("base"))


class FetchHandler(_Handler):
    async def post(self) -> None:
        from jupyter_portable.engine.lazy import ensure

        rel = self.checked_body("path-request.json")["path"]

        def fetch() -> dict[str, Any]:
            from jupyter_portable.engine.gate import InboundGate

            check_fits(self.state.workdir, check_relpath(rel))
            # the machine's own copy: the path rules only (the user's side has its own gate)
            ensure(WorkspaceCopy(self.state.workdir), rel, inbound=InboundGate.machine_side(self.state.workdir))
            return {"path": rel}

        await self.run(fetch)


class TreeHandler(_Handler):
    hashes: FileHashes

    def initialize(self, state: AgentState, hashes: FileHashes | None = None) -> None:  # type: ignore[override]
        super().initialize(state)
        assert hashes is not None
        self.hashes = hashes

    async def get(self) -> None:
        await self.run(self.hashes.tree, self.state)


class ReadHandler(_Handler):
    async def post(self) -> None:
        await self.run(read_file, self.state, self.checked_body("path-request.json")["path"])


class SealHandler(_Handler):
    async def post(self) -> None:
        message = self.checked_body("seal-request.json").get("message") or ""
        await self.run(seal, self.state, message)


class CredentialsHandler(_Handler):
    def put(self) -> None:
        from jupyter_portable.store.credentials import SessionCredentials, write

        body = self.checked_body("credentials-request.json")
        if self.state.credentials_expiration is None:
            raise ConflictError("this worker's store takes no credentials")
        creds = SessionCredentials.from_json(body)
        # botocore reads the file again when the credentials it holds near their expiry
        write(self.state.state_dir / "aws", creds)
        self.state.credentials_expiration = creds.expiration
        self.answer({"expiration": creds.expiration})


class ActivityHandler(_Handler):
    def post(self) -> None:
        self.checked_body("empty-request.json")
        self.answer({"kept_at": self.state.activity.keep()})


class KernelIOPubHandler(_Handler):
    def get(self) -> None:
        """The kernel's IOPub messages after ``after`` (a msg_id), as worker/iopub_log.py keeps them."""
        after = self.get_query_argument("after", "")
        if len(after) > 200:
            raise UsageError("after must be a msg_id (at most 200 characters)")
        self.answer(self.state.iopub_log.after(after))


class ShutdownHandler(_Handler):
    def post(self) -> None:
        self.checked_body("empty-request.json")
        # the machine is going (released): its kernel ends with it, which is no kernel death
        self.state.machine_gone = True
        self.answer({"stopping": True})
        IOLoop.current().add_callback(shutdown_soon, self.state)


def shutdown_soon(state: AgentState) -> None:
    stop_kernel(state)
    IOLoop.current().stop()


# (path, handler): every route of the worker's API, as the server's are one table
ROUTES: tuple[tuple[str, type[_Handler]], ...] = (
    (r"/status", StatusHandler), (r"/kernel", KernelHandler), (r"/kernel/signal", KernelSignalHandler),
    (r"/kernel/iopub", KernelIOPubHandler),
    (r"/snapshot", SnapshotHandler), (r"/files", FilesHandler), (r"/fetch", FetchHandler), (r"/seal", SealHandler),
    (r"/shutdown", ShutdownHandler), (r"/credentials", CredentialsHandler), (r"/activity", ActivityHandler),
    (r"/tree", TreeHandler), (r"/read", ReadHandler),
)


def make_app(state: AgentState) -> web.Application:
    hashes = FileHashes()
    return web.Application([(path, handler, {"state": state, **({"hashes": hashes} if handler is TreeHandler else {})})
                            for path, handler in ROUTES])


__all__ = ["MAX_BODY", "ROUTES", "SCHEMA_DIR", "make_app", "schemas"]
