"""The Jupyter server extension: thin handlers over the facade (orchestration/facade.py).

A handler reads its request, checks a body against its committed JSON Schema
(``schemas/*-request.json``, by ``requests.read_body``) and a query against its own
(``schemas/*-query.json``), calls one method of :class:`PortableFacade` (on the service's
threads where it blocks) and writes the answer, or raises. An error's status is its row in
``core.http_status.HTTP_STATUS`` (the worker's API uses the same table), its answer
``{"error", "hint"}``. Every handler is ``@web.authenticated`` (the server refuses anything else
when ``allow_unauthenticated_access`` is off); bad JSON or bad values get a 400 with a one-line
message. The API and its events are documented in ``docs/api.md``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from jupyter_portable.core.errors import PortableError
from jupyter_portable.core.http_status import error_answer, status_for
from jupyter_portable.core.settings import RENAMED
from jupyter_portable.interfaces.serverext.requests import read_body, read_query
from jupyter_portable.orchestration.facade import PortableFacade
from jupyter_portable.orchestration.monitor import SCHEMAS, PortableService, find_workspace

if TYPE_CHECKING:
    from jupyter_portable.engine.workspace import Workspace
    from jupyter_portable.orchestration.machines import OrphanSweep

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

    @property
    def facade(self) -> PortableFacade:
        return self.settings["portable_facade"]  # type: ignore[no-any-return]

    def checked_body(self, schema: str, *, allow: Any = ()) -> dict[str, Any]:
        """The body, checked against ``schemas/<schema>``: a 400 naming the field it refuses."""
        return read_body(self.request.body, schema, allow=allow)

    def checked_query(self, schema: str) -> dict[str, Any]:
        """The query parameters, typed and checked against ``schemas/<schema>``: a 400 naming the one it refuses."""
        return read_query(self.request.query_arguments, schema)

    def reply(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj, default=str, allow_nan=False))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        reason = exc.reason if isinstance(exc, web.HTTPError) and exc.reason else self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(error_answer(exc, reason)))

    def _handle_request_exception(self, e: BaseException) -> None:
        # Our typed errors become the status of their row in core.http_status.HTTP_STATUS; anything
        # else (and a PortableError with no better row) stays a 500 with its traceback logged.
        status = status_for(e)
        if status is not None and status != 500 and not self._finished:
            if status >= 500:  # what this server relies on failed: the log says so too
                self.log.warning("jupyter-portable: %s %s: %s", self.request.method, self.request.path,
                                 e.one_line() if isinstance(e, PortableError) else e)
            self.send_error(status, exc_info=(type(e), e, e.__traceback__))
            return
        super()._handle_request_exception(e)

    async def blocking(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the service's threads (a facade method that reads the store or
        asks a provider), awaited here so the server's loop goes on serving."""
        from tornado.ioloop import IOLoop

        return await IOLoop.current().run_in_executor(self.service.pool, lambda: fn(*args, **kwargs))


class StateHandler(_Base):
    @web.authenticated
    async def get(self) -> None:
        self.reply(await self.blocking(self.facade.state))


class RoutesHandler(_Base):
    @web.authenticated
    async def get(self) -> None:
        query = self.checked_query("routes-query.json")
        self.reply(await self.blocking(self.facade.routes, query.get("hours")))


class ContinueHandler(_Base):
    @web.authenticated
    async def post(self) -> None:
        body = self.checked_body("continue-request.json")
        self.reply(await self.blocking(self.facade.start_continue, body.get("route")), 202)


class CancelHandler(_Base):
    @web.authenticated
    async def post(self) -> None:
        self.checked_body("empty-request.json")
        self.reply(self.facade.cancel())


class StopHandler(_Base):
    @web.authenticated
    async def post(self) -> None:
        self.checked_body("empty-request.json")
        self.reply(await self.blocking(self.facade.stop))


class KeepRunningHandler(_Base):
    """"Keep running": the active machine's idle clock starts again (another idle_minutes)."""

    @web.authenticated
    async def post(self) -> None:
        self.checked_body("empty-request.json")
        self.reply(await self.blocking(self.facade.keep_running))


class SnapshotHandler(_Base):
    @web.authenticated
    async def post(self) -> None:
        body = self.checked_body("snapshot-request.json")
        self.reply(await self.blocking(self.facade.snapshot, body.get("message") or ""))


class CheckpointsHandler(_Base):
    @web.authenticated
    async def get(self) -> None:
        self.reply(await self.blocking(self.facade.checkpoints))


class FilesHandler(_Base):
    @web.authenticated
    async def get(self) -> None:
        self.reply(await self.blocking(self.facade.files))


class ReservationsHandler(_Base):
    @web.authenticated
    async def get(self) -> None:
        query = self.checked_query("reservations-query.json")
        self.reply(await self.blocking(self.facade.reservations, query.get("days", 7)))

    @web.authenticated
    async def post(self) -> None:
        body = self.checked_body("reservation-request.json")
        self.reply(await self.blocking(self.facade.reserve, body["offer"], body["start"], body["hours"],
                                       body.get("charge", "before"), body.get("max_price")), 201)


class ReservationCheckHandler(_Base):
    """POST reservations/check: what booking this body would answer now (its problem, charge time
    and price), by the same checks, with nothing booked or bought."""

    @web.authenticated
    async def post(self) -> None:
        body = self.checked_body("reservation-request.json")  # the booking's own body
        self.reply(await self.blocking(self.facade.check_booking, body["offer"], body["start"], body["hours"],
                                       body.get("charge", "before"), body.get("max_price")))


class ReservationHandler(_Base):
    @web.authenticated
    async def delete(self, reservation_id: str) -> None:
        self.reply(await self.blocking(self.facade.cancel_reservation, reservation_id))


class SettingsHandler(_Base):
    """What the workspace needs and may spend (kept with it in its store): GET, and PUT to change
    fields (a field left out stays as it is; "" clears it)."""

    @web.authenticated
    async def get(self) -> None:
        self.reply(await self.blocking(self.facade.settings))

    @web.authenticated
    async def put(self) -> None:
        # the schema checks each value's shape, core.settings its rules; a renamed setting passes the
        # schema to be told, by core.settings, what replaced it
        body = self.checked_body("settings-request.json", allow=RENAMED)
        self.reply(await self.blocking(self.facade.update_settings, body))


class OrphansHandler(_Base):
    """The machines the providers hold for us that no known workspace uses (docs/api.md)."""

    @web.authenticated
    async def get(self) -> None:
        query = self.checked_query("orphans-query.json")
        self.reply(await self.blocking(self.facade.orphans, query.get("refresh") == 1))

    @web.authenticated
    async def post(self) -> None:
        """``{"terminate": "provider/ref"}``: terminate that orphan, confirmed by its provider."""
        body = self.checked_body("orphans-request.json")
        self.reply(await self.blocking(self.facade.terminate_orphan, body["terminate"]))


class NotFoundHandler(_Base):
    @web.authenticated
    def get(self, path: str) -> None:
        raise web.HTTPError(404, reason=f"unknown endpoint portable/api/{path[:80]}")

    post = put = delete = get


def _raise(exc: Exception) -> Any:
    raise exc


def _sweep_orphans(service: PortableService, ws: Workspace | None) -> OrphanSweep:
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

    config: Portable | None = None
    try:
        config = Portable(parent=serverapp)
    except PortableError as exc:  # the server still starts; every call then says what to fix
        serverapp.log.error("jupyter-portable: %s", exc.one_line())
        error = exc
    # c.Portable.workspace (or its variable), else the workspace holding the root folder
    ws = find_workspace(serverapp.root_dir, config.workspace if config is not None else None)
    if config is None:
        service = PortableService(serverapp, ws, providers=lambda: _raise(error))
    else:
        service = PortableService(serverapp, ws, check_interval_s=config.check_interval_s,
                                  reservation_interval_s=config.reservation_interval_s,
                                  providers=config.make_providers, environment=config.environment,
                                  first_machine=config.first_machine, boot_timeout=config.boot_timeout,
                                  pass_env=config.pass_env,
                                  now=config.clock())
    for name, _schema_id in SCHEMAS:
        serverapp.event_logger.register_event_schema(Path(__file__).parent / "events" / name)
    # after a move JupyterLab's status bar and execution indicator hear the kernel's real state
    from jupyter_portable.interfaces.serverext.kernel_socket import install as install_kernel_socket

    install_kernel_socket(serverapp)
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
    web_app.settings["portable_facade"] = PortableFacade(service, _sweep_orphans(service, ws))
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
        (url_path_join(base, "reservations/check"), ReservationCheckHandler),
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
