"""The server extension's one entry into the work: a method per REST endpoint (docs/api.md).

As jupyterlab-git keeps ``Git`` behind its handlers, the handlers of ``interfaces/serverext`` only
read and check a request (its JSON Schema), call one method here, and write the answer; the status
of an error is its row in ``core/http_status``. The methods take checked, typed arguments, may
block (the handlers run them on the service's threads), return what the endpoint answers as plain
JSON-ready values, and raise only the package's errors. Nothing here knows HTTP or Jupyter Server.
"""

from __future__ import annotations

from typing import Any

from jupyter_portable.core.errors import ReservationNotFound, WorkspaceNotFound
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.orchestration.machines import OrphanSweep
from jupyter_portable.orchestration.monitor import PortableService


class PortableFacade:
    """One server's workspace, as its REST API reaches it. ``service``: the server's
    :class:`PortableService`; ``orphans``: the sweep of machines no known workspace uses."""

    def __init__(self, service: PortableService, orphans: OrphanSweep) -> None:
        self.service = service
        self.orphans_sweep = orphans

    def workspace(self) -> Workspace:
        """The workspace this server serves; WorkspaceNotFound when it was started outside one."""
        ws = self.service.ws
        if ws is None:
            raise WorkspaceNotFound("this server was not started in a workspace",
                                    hint="start JupyterLab inside a workspace folder")
        return ws

    # -- GET state, routes, checkpoints, files ------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What the sidebar shows; never calls a provider."""
        self.workspace()
        return self.service.state()

    def routes(self, hours: float | None) -> dict[str, Any]:
        """Every offer ranked as a route for ``hours`` (None: the workspace's planned hours)."""
        from jupyter_portable.core.routing import best_route
        from jupyter_portable.orchestration.routes import compute_routes

        ws = self.workspace()
        orch = self.service.orchestrator()
        # the budget's left as the sidebar's state shows it: the same spend figures, the same calendar
        routes, errors = compute_routes(ws, hours=hours, providers=orch.providers, calendar_now=self.service.now(),
                                        figure=self.service.spend_figure(),
                                        notice_s=getattr(self.service, "check_interval_s", None))
        best = best_route(routes)
        return {"routes": [r.to_json() for r in routes], "best": best.id if best else None, "errors": errors,
                "hours": hours}

    def checkpoints(self) -> dict[str, Any]:
        from jupyter_portable.orchestration.state_view import checkpoints_view

        return checkpoints_view(self.workspace())

    def files(self) -> dict[str, Any]:
        from jupyter_portable.orchestration.state_view import files_view

        ws = self.workspace()
        return files_view(ws, self.service.orchestrator(), self.service.conflicts)

    # -- POST continue, cancel, stop, keep-running, snapshot ------------------------------------------

    def start_continue(self, route_id: str | None) -> dict[str, Any]:
        """Start a Continue in the background (``Orchestrator.continue_`` on the service's threads),
        first on the route ``route_id`` when one is named (it must be open)."""
        ws = self.workspace()
        if route_id is not None:
            from jupyter_portable.orchestration.routes import open_route

            open_route(ws, route_id, providers=self.service.orchestrator().providers)
        self.service.start_continue(route_id)
        return {"started": True, "state": self.service.orchestrator().lifecycle().state}

    def cancel(self) -> dict[str, Any]:
        """Tell a running Continue to stop at its next step; whether one was running."""
        running = self.service.is_continuing()
        if running:
            self.service.orchestrator().cancel()
        return {"cancelled": running}

    def stop(self) -> dict[str, Any]:
        """Seal the workspace and release its machine."""
        self.workspace()
        return self.service.orchestrator().stop()

    def keep_running(self) -> dict[str, Any]:
        """The active machine's idle clock starts again (another idle_minutes)."""
        self.workspace()
        assert self.service.idle is not None
        return self.service.idle.keep_running()

    def snapshot(self, message: str) -> dict[str, Any]:
        """Publish a version of the workspace, told to the sidebar as it starts and ends."""
        ws = self.workspace()
        self.service.on_progress({"workspace_id": ws.workspace_id, "step": "snapshot", "message": "publishing",
                                  "done": None, "total": None})
        out = self.service.orchestrator().snapshot(message)
        self.service.on_progress({"workspace_id": ws.workspace_id, "step": "snapshot",
                                  "message": f"version {out['version']}", "done": 1, "total": 1})
        return out

    # -- reservations ----------------------------------------------------------------------------------

    def reservations(self, days: int) -> dict[str, Any]:
        """The workspace's bookings and the calendar of the next ``days`` days."""
        from jupyter_portable.orchestration.reservations import booking_view, calendar, read_reservations

        ws = self.workspace()
        orch = self.service.orchestrator()
        now = self.service.now()
        books, skipped = read_reservations(ws)
        cal = calendar(ws, days, providers=orch.providers, now=now)
        return {"reservations": [booking_view(b, now) for b in books], "calendar": cal, "skipped": skipped}

    def reserve(self, offer: str, start: str, hours: float, charge: str = "before",
                max_price: float | None = None) -> dict[str, Any]:
        """Book ``hours`` of ``offer`` from ``start``; ``max_price``: the price the user was shown and
        confirmed, for a slot the provider sells (an AWS Capacity Block)."""
        from jupyter_portable.orchestration.reservations import reserve

        booking = reserve(self.workspace(), offer, start, float(hours), charge,
                          providers=self.service.orchestrator().providers, now=self.service.now(),
                          max_price=max_price)
        self.service.documents_changed("reservations")  # a booking holds money back: the state's budget changes
        return _booking_answer(booking)

    def check_booking(self, offer: str, start: str, hours: float, charge: str = "before",
                      max_price: float | None = None) -> dict[str, Any]:
        """What :meth:`reserve` would answer now, by the same checks, with nothing booked or bought:
        the problem (None when it would book), the charge time and the price."""
        from jupyter_portable.orchestration.reservations import check_booking

        return check_booking(self.workspace(), offer, start, float(hours), charge, max_price=max_price,
                             providers=self.service.orchestrator().providers, now=self.service.now())

    def cancel_reservation(self, reservation_id: str) -> dict[str, Any]:
        """Cancel one of the workspace's bookings; ReservationNotFound when it has no such one."""
        from jupyter_portable.orchestration.reservations import cancel_reservation, reservations

        ws = self.workspace()
        if reservation_id not in {b.reservation_id for b in reservations(ws)}:
            raise ReservationNotFound(f"no reservation {reservation_id}")
        booking = cancel_reservation(ws, reservation_id, providers=self.service.orchestrator().providers,
                                     now=self.service.now())
        self.service.documents_changed("reservations")
        return _booking_answer(booking)

    # -- settings --------------------------------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        from jupyter_portable.orchestration.settings import load_settings

        return load_settings(self.workspace()).to_json()

    def update_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Change the fields of ``changes`` (a field left out stays as it is; "" clears it), each
        checked by core.settings before anything is stored; the settings after the change."""
        from jupyter_portable.orchestration.settings import update_settings

        settings = update_settings(self.workspace(), **changes)
        # a new idle_minutes counts from the next check; the budget's figures are built again at once
        self.service.documents_changed("settings")
        return settings.to_json()

    # -- orphans ---------------------------------------------------------------------------------------

    def orphans(self, refresh: bool = False) -> dict[str, Any] | None:
        """The machines the providers hold for us that no known workspace uses (swept again first
        when ``refresh``); None before the first sweep finished."""
        self.workspace()
        if refresh:
            self.orphans_sweep.sweep()
        return self.orphans_sweep.view()

    def terminate_orphan(self, target: str) -> dict[str, Any]:
        """Terminate one listed orphan (``provider/ref``), confirmed by its provider."""
        self.workspace()
        return self.orphans_sweep.terminate(target)


def _booking_answer(booking: Any) -> dict[str, Any]:
    """A booking as POST and DELETE answer it: what was recorded, in the words the calendar
    promised it with (the sidebar keeps no copy of those words)."""
    from jupyter_portable.core.calendar import GUARANTEE_TEXT

    return {**booking.to_json(), "guarantee_text": GUARANTEE_TEXT[booking.guarantee]}


__all__ = ["PortableFacade"]

