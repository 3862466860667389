"""The Jupyter server extension: thin handlers over the workspace and the orchestrator.

Every handler is ``@web.authenticated`` (the server refuses anything else when
``allow_unauthenticated_access`` is off); bad JSON or bad values get a 400 with a one-line
message. The API and its events are documented in ``docs/api.md``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from jupyter_portable.core.errors import (
    ComputeError,
    ConflictError,
    ManifestError,
    PortableError,
    UnsafePath,
    UsageError,
    WorkspaceNotFound,
)
from jupyter_portable.core.settings import FIELD_NAMES
from jupyter_portable.core.validate import loads_strict
from jupyter_portable.orchestration.monitor import SCHEMAS, PortableService, find_workspace
from jupyter_portable.orchestration.state_view import checkpoints_view, files_view

API = "portable/api"
MAX_BODY = 64 * 1024  # every body of this API is a few fields; anything larger is refused unread
KERNELS_DIR = Path(__file__).resolve().parents[2] / "data"


class _Base(APIHandler):  # type: ignore[misc]
    async def prepare(self) -> None:  # type: ignore[override]
        if len(self.request.body or b"") > MAX_BODY:
            raise web.HTTPError(413, reason=f"the body is larger than {MAX_BODY // 1024} KiB")
        await super().prepare()

    @property
    def service(self) -> PortableService:
        return self.settings["portable_service"]  # type: ignore[no-any-return]

    def json_body(self, allowed: set[str]) -> dict[str, Any]:
        raw = self.request.body or b"{}"
        # strict: no key twice, no NaN, bounded nesting (a deep body is a 400, not a RecursionError)
        obj = loads_strict(raw, "the body", error=UsageError)
        if not isinstance(obj, dict):
            raise web.HTTPError(400, reason="the body must be a JSON object")
        unknown = set(obj) - allowed
        if unknown:
            raise web.HTTPError(400, reason=f"unknown field(s): {', '.join(sorted(unknown))}")
        return obj

    def reply(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj, default=str, allow_nan=False))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        hint = None
        if isinstance(exc, PortableError):
            message, hint = str(exc), exc.hint
        elif isinstance(exc, web.HTTPError) and exc.reason:
            message = exc.reason
        else:
            message = self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message, "hint": hint}))

    def _handle_request_exception(self, e: BaseException) -> None:
        # Our typed errors become status codes; anything else stays a 500 with its traceback logged.
        if isinstance(e, (UsageError, ManifestError, UnsafePath)) and not self._finished:
            self.send_error(400, exc_info=(type(e), e, e.__traceback__))
            return
        if isinstance(e, WorkspaceNotFound) and not self._finished:
            self.send_error(404, exc_info=(type(e), e, e.__traceback__))
            return
        if isinstance(e, (ConflictError, ComputeError)) and not self._finished:
            self.send_error(409, exc_info=(type(e), e, e.__traceback__))
            return
        super()._handle_request_exception(e)

    async def blocking(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from tornado.ioloop import IOLoop

        return await IOLoop.current().run_in_executor(self.service.pool, lambda: fn(*args, **kwargs))

    def workspace(self) -> Any:
        ws = self.service.ws
        if ws is None:
            raise WorkspaceNotFound("this server was not started in a workspace",
                                    hint="start JupyterLab inside a workspace folder")
        return ws


def _number(value: str | None, what: str, default: float, lo: float, hi: float) -> float:
    if value is None:
        return default
    try:
        n = float(value)
    except ValueError:
        raise web.HTTPError(400, reason=f"{what} must be a number") from None
    if not lo <= n <= hi:
        raise web.HTTPError(400, reason=f"{what} must be within {lo:g}..{hi:g}")
    return n


class StateHandler(_Base):
    @web.authenticated
    async def get(self) -> None:
        self.workspace()
        self.reply(await self.blocking(self.service.state))


class RoutesHandler(_Base):
    @web.authenticated
    async def get(self) -> None:
        from jupyter_portable.orchestration.routes import compute_routes

        ws = self.workspace()
        hours = _number(self.get_argument("hours", None), "hours", 0, 0.01, 24 * 365) or None
        orch = self.service.orchestrator()
        routes, errors = await self.blocking(compute_routes, ws, hours=hours, providers=orch.providers)
        best = next((r.id for r in routes if not r.blocked), None)
        self.reply({"routes": [r.to_json() for r in routes], "best": best, "errors": errors, "hours": hours})


class ContinueHandler(_Base):
    @web.authenticated
    async def post(self) -> None:
        self.workspace()
        body = self.json_body({"route"})
        route = body.get("route")
        if route is not None and (not isinstance(route, str) or not route.startswith("r-") or len(route) > 40):
            raise web.HTTPError(400, reason="route must be a route id such as r-0123456789, or null")
        if route is not None:
            from jupyter_portable.orchestration.routes import open_route

            await self.blocking(open_route, self.workspace(), route, providers=self.service.orchestrator().providers)
        await self.blocking(self.service.start_continue, route)
        self.reply({"started": True, "state": self.service.orchestrator().lifecycle().state}, 202)


class CancelHandler(_Base):
    @web.authenticated
    async def post(self) -> None:
        self.json_body(set())
        running = self.service.is_continuing()
        if running:
            self.service.orchestrator().cancel()
        self.reply({"cancelled": running})


class StopHandler(_Base):
    @web.authenticated
    async def post(self) -> None:
        self.workspace()
        self.json_body(set())
        out = await self.blocking(self.service.orchestrator().stop)
        self.reply(out)


class KeepRunningHandler(_Base):
    """"Keep running": the active machine's idle clock starts again (another idle_minutes)."""

    @web.authenticated
    async def post(self) -> None:
        self.workspace()
        self.json_body(set())
        assert self.service.idle is not None
        self.reply(await self.blocking(self.service.idle.keep_running))


class SnapshotHandler(_Base):
    @web.authenticated
    async def post(self) -> None:
        ws = self.workspace()
        body = self.json_body({"message"})
        message = body.get("message") or ""
        if not isinstance(message, str) or len(message) > 1000:
            raise web.HTTPError(400, reason="message must be text (at most 1000 characters)")
        self.service.on_progress({"workspace_id": ws.workspace_id, "step": "snapshot", "message": "publishing",
                                  "done": None, "total": None})
        out = await self.blocking(self.service.orchestrator().snapshot, message)
        self.service.on_progress({"workspace_id": ws.workspace_id, "step": "snapshot",
                                  "message": f"version {out['version']}", "done": 1, "total": 1})
        self.reply(out)


class CheckpointsHandler(_Base):
    @web.authenticated
    async def get(self) -> None:
        self.reply(await self.blocking(checkpoints_view, self.workspace()))


class FilesHandler(_Base):
    @web.authenticated
    async def get(self) -> None:
        ws = self.workspace()
        self.reply(await self.blocking(files_view, ws, self.service.orchestrator(), self.service.conflicts))


class ReservationsHandler(_Base):
    @web.authenticated
    async def get(self) -> None:
        from jupyter_portable.core.times import utcnow
        from jupyter_portable.orchestration.reservations import booking_view, calendar, read_reservations

        ws = self.workspace()
        days = int(_number(self.get_argument("days", None), "days", 7, 1, 31))
        orch = self.service.orchestrator()
        books, skipped = await self.blocking(read_reservations, ws)
        cal = await self.blocking(calendar, ws, days, providers=orch.providers)
        now = utcnow()
        self.reply({"reservations": [booking_view(b, now) for b in books], "calendar": cal, "skipped": skipped})

    @web.authenticated
    async def post(self) -> None:
        from jupyter_portable.orchestration.reservations import reserve

        ws = self.workspace()
        body = self.json_body({"offer", "start", "hours", "charge"})
        offer, start, hours = body.get("offer"), body.get("start"), body.get("hours")
        charge = body.get("charge", "before")
        if not isinstance(offer, str) or "/" not in offer:
            raise web.HTTPError(400, reason="offer must be provider/offer-id")
        if not isinstance(start, str):
            raise web.HTTPError(400, reason="start must be an ISO 8601 time")
        if isinstance(hours, bool) or not isinstance(hours, (int, float)):
            raise web.HTTPError(400, reason="hours must be a number")
        if charge not in ("now", "before"):
            raise web.HTTPError(400, reason="charge must be 'now' or 'before'")
        booking = await self.blocking(reserve, ws, offer, start, float(hours), charge,
                                      providers=self.service.orchestrator().providers)
        self.reply(booking.to_json(), 201)


class ReservationHandler(_Base):
    @web.authenticated
    async def delete(self, reservation_id: str) -> None:
        from jupyter_portable.orchestration.reservations import cancel_reservation, reservations

        ws = self.workspace()
        known = {b.reservation_id for b in await self.blocking(reservations, ws)}
        if reservation_id not in known:
            raise web.HTTPError(404, reason=f"no reservation {reservation_id}")
        booking = await self.blocking(cancel_reservation, ws, reservation_id,
                                      providers=self.service.orchestrator().providers)
        self.reply(booking.to_json())


class SettingsHandler(_Base):
    """What the workspace needs and may spend (kept with it in its store): GET, and PUT to change
    fields (a field left out stays as it is; "" clears it)."""

    @web.authenticated
    async def get(self) -> None:
        from jupyter_portable.orchestration.settings import load_settings

        self.reply((await self.blocking(load_settings, self.workspace())).to_json())

    @web.authenticated
    async def put(self) -> None:
        from jupyter_portable.orchestration.settings import update_settings

        ws = self.workspace()
        body = self.json_body(set(FIELD_NAMES))  # each value is checked by core.settings before it is stored
        settings = await self.blocking(update_settings, ws, **body)
        if self.service.idle is not None:
            self.service.idle.settings_changed()  # a new idle_minutes counts from the next check
        self.reply(settings.to_json())


class OrphansHandler(_Base):
    """The machines the providers hold for us that no known workspace uses (docs/api.md)."""

    @property
    def sweep(self) -> Any:
        return self.settings["portable_orphans"]

    @web.authenticated
    async def get(self) -> None:
        self.workspace()
        if self.get_argument("refresh", "0") == "1":
            await self.blocking(self.sweep.sweep)
        self.reply(self.sweep.view())

    @web.authenticated
    async def post(self) -> None:
        """``{"terminate": "provider/ref"}``: terminate that orphan, confirmed by its provider."""
        self.workspace()
        target = self.json_body({"terminate"}).get("terminate")
        if not isinstance(target, str) or not target or len(target) > 300:
            raise web.HTTPError(400, reason="terminate must name a listed orphan as provider/ref")
        self.reply(await self.blocking(self.sweep.terminate, target))


class NotFoundHandler(_Base):
    @web.authenticated
    def get(self, path: str) -> None:
        raise web.HTTPError(404, reason=f"unknown endpoint portable/api/{path[:80]}")

    post = put = delete = get


def _raise(exc: Exception) -> Any:
    raise exc


def _sweep_orphans(service: PortableService, ws: Any) -> Any:
    """Look for orphans once, in the background, as the server starts; the state shows them."""
    import functools

    from jupyter_portable.orchestration.machines import OrphanSweep

    providers = functools.cache(lambda: service.make_providers() if service.make_providers else {})
    sweep = OrphanSweep(providers, lambda: [ws] if ws is not None else [])
    if ws is not None and service.view is not None:
        service.view.orphans = sweep.view
        service.pool.submit(sweep.sweep)
    return sweep


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from jupyter_portable.interfaces.config import Portable

    ws = find_workspace(serverapp.root_dir)
    try:
        config = Portable(parent=serverapp)
    except PortableError as exc:  # the server still starts; every call then says what to fix
        serverapp.log.error("jupyter-portable: %s", exc.one_line())
        error = exc
        service = PortableService(serverapp, ws, providers=lambda: _raise(error))
    else:
        service = PortableService(serverapp, ws, check_interval_s=config.check_interval_s,
                                  reservation_interval_s=config.reservation_interval_s,
                                  providers=config.make_providers)
    for name, _schema_id in SCHEMAS:
        serverapp.event_logger.register_event_schema(Path(__file__).parent / "events" / name)
    ksm = serverapp.kernel_spec_manager
    if str(KERNELS_DIR / "kernels") not in ksm.kernel_dirs:
        ksm.kernel_dirs.insert(0, str(KERNELS_DIR / "kernels"))
    if ws is not None:
        # saves are forwarded to the worker (service.post_save), and the worker's files are pulled
        # back every 2 s while it serves (orchestration/follow.py, docs/file-browser.md)
        from jupyter_portable.orchestration.follow import start_following

        serverapp.web_app.settings["portable_follow"] = start_following(service, serverapp.contents_manager)
    web_app = serverapp.web_app
    base = url_path_join(web_app.settings["base_url"], API)
    web_app.settings["portable_service"] = service
    web_app.settings["portable_orphans"] = _sweep_orphans(service, ws)
    web_app.add_handlers(".*$", [
        (url_path_join(base, "state"), StateHandler),
        (url_path_join(base, "routes"), RoutesHandler),
        (url_path_join(base, "continue"), ContinueHandler),
        (url_path_join(base, "cancel"), CancelHandler),
        (url_path_join(base, "stop"), StopHandler),
        (url_path_join(base, "keep-running"), KeepRunningHandler),
        (url_path_join(base, "snapshot"), SnapshotHandler),
        (url_path_join(base, "checkpoints"), CheckpointsHandler),
        (url_path_join(base, "files"), FilesHandler),
        (url_path_join(base, "settings"), SettingsHandler),
        (url_path_join(base, "reservations"), ReservationsHandler),
        (url_path_join(base, "orphans"), OrphansHandler),
        (url_path_join(base, r"reservations/([A-Za-z0-9_.-]{1,80})"), ReservationHandler),
        (url_path_join(base, r"(.*)"), NotFoundHandler),
    ])
    service.start()
    serverapp.log.info("jupyter-portable: serving %s", f"workspace {ws.workspace_id} at {ws.root}" if ws
                       else "no workspace (start the server inside one)")


def _unload_jupyter_server_extension(serverapp: Any) -> None:
    service = serverapp.web_app.settings.get("portable_service")
    follower = serverapp.web_app.settings.get("portable_follow")
    if follower is not None and follower.timer is not None:
        follower.timer.stop()
    if service is not None:
        service.stop_timers()


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_portable.interfaces.serverext"}]


__all__: list[str] = []
