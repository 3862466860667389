"""The worker agent's HTTP API: a tornado app on the machine's loopback only, every request
carrying the per-allocation token.

API (JSON; ``Authorization: token <token>``)::

    GET  /status                    phase, version, epoch, verification, progress, pending files
    POST /kernel   {"kernel_id"}    start (or restart) the kernel; its connection info (ports on 127.0.0.1)
    GET  /kernel                    {"alive": bool, "returncode": int | null}
    POST /kernel/signal {"signum"}  signal the kernel
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
import errno
import hmac
import json
import signal
from typing import Any

from tornado import web
from tornado.ioloop import IOLoop

from jupyter_portable.core.errors import ConflictError, PortableError, UnsafePath, UsageError
from jupyter_portable.core.paths import check_relpath
from jupyter_portable.core.validate import loads_strict, short_repr
from jupyter_portable.workdir.workcopy import WorkspaceCopy
from jupyter_portable.worker.agent import check_fits, list_files, put_file, seal, take_snapshot
from jupyter_portable.worker.follow import FileHashes, read_file
from jupyter_portable.worker.kernel import start_watched_kernel, stop_kernel
from jupyter_portable.worker.state import AgentState

_REQUEST_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR, errno.EISDIR})
MAX_BODY = 64 * 2**20  # an edit saved in JupyterLab; large data goes through the store (daemon's HTTPServer)


class _Handler(web.RequestHandler):
    state: AgentState

    def initialize(self, state: AgentState) -> None:
        self.state = state

    def prepare(self) -> None:
        given = self.request.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "token" or not hmac.compare_digest(token.encode(), self.state.token.encode()):
            raise web.HTTPError(403, reason="a valid token is required")

    def body(self) -> dict[str, Any]:
        if not self.request.body:
            return {}
        try:
            # strict and bounded: a body nested past MAX_JSON_DEPTH is a 400, not a RecursionError
            obj = loads_strict(self.request.body, "the body", error=UsageError)
        except UsageError as exc:
            raise web.HTTPError(400, reason=exc.one_line()) from None
        if not isinstance(obj, dict):
            raise web.HTTPError(400, reason="the body must be a JSON object")
        return obj

    def answer(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))
        if self.state.guardian is not None:
            self.state.guardian.heard()  # the user side is there (worker/guardian)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = self._reason
        if isinstance(exc, web.HTTPError) and exc.reason:
            message = exc.reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message}))

    async def run(self, fn: Any, *args: Any) -> None:
        try:
            result = await IOLoop.current().run_in_executor(None, fn, *args)
        except ConflictError as exc:
            self.answer({"error": exc.one_line(), "type": "ConflictError", **_jsonable(exc.context)}, 409)
            return
        except (UsageError, UnsafePath) as exc:
            self.answer({"error": exc.one_line(), "type": type(exc).__name__}, 400)
            return
        except OSError as exc:
            if exc.errno not in _REQUEST_ERRNOS:
                raise
            # a path the request named that this filesystem cannot hold or follow
            self.answer({"error": f"{exc.strerror}: {short_repr(exc.filename or '')}", "type": "UsageError"}, 400)
            return
        except PortableError as exc:
            self.answer({"error": exc.one_line(), "type": type(exc).__name__}, 500)
            return
        self.answer(result)


def _jsonable(context: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in context.items() if isinstance(v, (str, int, float, bool)) or v is None}


class StatusHandler(_Handler):
    def get(self) -> None:
        self.answer(self.state.status())


class KernelHandler(_Handler):
    async def post(self) -> None:
        kernel_id = str(self.body().get("kernel_id") or "kernel")
        if not kernel_id.replace("-", "").isalnum() or len(kernel_id) > 64:
            raise web.HTTPError(400, reason="bad kernel_id")
        if self.state.phase != "ready":
            raise web.HTTPError(409, reason=f"the worker is {self.state.phase}, not ready")
        await self.run(start_watched_kernel, self.state, kernel_id)

    def get(self) -> None:
        self.answer(self.state.kernel_status())

    async def delete(self) -> None:
        def stop() -> dict[str, Any]:
            stop_kernel(self.state)
            return {"stopped": True}

        await self.run(stop)


class KernelSignalHandler(_Handler):
    def post(self) -> None:
        signum = self.body().get("signum")
        if not isinstance(signum, int) or signum not in {s.value for s in signal.Signals}:
            raise web.HTTPError(400, reason="signum must be a signal number")
        k = self.state.kernel
        if k is None or k.poll() is not None:
            raise web.HTTPError(409, reason="no kernel is running")
        k.send_signal(signum)
        self.answer({"sent": signum})


class SnapshotHandler(_Handler):
    async def post(self) -> None:
        message = self.body().get("message") or ""
        if not isinstance(message, str):
            raise web.HTTPError(400, reason="message must be text")
        await self.run(take_snapshot, self.state, message)


class FilesHandler(_Handler):
    async def get(self) -> None:
        await self.run(list_files, self.state)

    async def put(self) -> None:
        body = self.body()
        rel, content, base = body.get("path"), body.get("content"), body.get("base")
        if not isinstance(rel, str) or not isinstance(content, str) or not (base is None or isinstance(base, str)):
            raise web.HTTPError(400, reason="expected {path: str, content: base64 str, base: hash or null}")
        try:
            data = base64.b64decode(content, validate=True)
        except ValueError:
            raise web.HTTPError(400, reason="content is not base64") from None
        await self.run(put_file, self.state, rel, data, base)


class FetchHandler(_Handler):
    async def post(self) -> None:
        from jupyter_portable.engine.lazy import ensure

        rel = self.body().get("path")
        if not isinstance(rel, str):
            raise web.HTTPError(400, reason="path must be text")
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
        rel = self.body().get("path")
        if not isinstance(rel, str):
            raise web.HTTPError(400, reason="path must be text")
        await self.run(read_file, self.state, rel)


class SealHandler(_Handler):
    async def post(self) -> None:
        message = self.body().get("message") or ""
        await self.run(seal, self.state, str(message))


class CredentialsHandler(_Handler):
    def put(self) -> None:
        from jupyter_portable.store.credentials import SessionCredentials, write

        if self.state.credentials_expiration is None:
            raise web.HTTPError(409, reason="this worker's store takes no credentials")
        try:
            creds = SessionCredentials.from_json(self.body())
        except UsageError as exc:
            raise web.HTTPError(400, reason=exc.one_line()) from None
        # botocore reads the file again when the credentials it holds near their expiry
        write(self.state.state_dir / "aws", creds)
        self.state.credentials_expiration = creds.expiration
        self.answer({"expiration": creds.expiration})


class ActivityHandler(_Handler):
    def post(self) -> None:
        self.body()
        self.answer({"kept_at": self.state.activity.keep()})


class ShutdownHandler(_Handler):
    def post(self) -> None:
        # the machine is going (released): its kernel ends with it, which is no kernel death
        self.state.machine_gone = True
        self.answer({"stopping": True})
        IOLoop.current().add_callback(shutdown_soon, self.state)


def shutdown_soon(state: AgentState) -> None:
    stop_kernel(state)
    IOLoop.current().stop()


def make_app(state: AgentState) -> web.Application:
    args = {"state": state}
    return web.Application([
        (r"/status", StatusHandler, args), (r"/kernel", KernelHandler, args),
        (r"/kernel/signal", KernelSignalHandler, args), (r"/snapshot", SnapshotHandler, args),
        (r"/files", FilesHandler, args), (r"/fetch", FetchHandler, args), (r"/seal", SealHandler, args),
        (r"/shutdown", ShutdownHandler, args), (r"/credentials", CredentialsHandler, args),
        (r"/activity", ActivityHandler, args),
        (r"/tree", TreeHandler, {**args, "hashes": FileHashes()}), (r"/read", ReadHandler, args),
    ])
