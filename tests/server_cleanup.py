"""The teardown of a test's Jupyter server: pytest-jupyter's ``jp_server_cleanup``, replaced (conftest
imports this fixture under the plugin's name, and a conftest fixture wins over a plugin's) so that one
failure stays one.

The plugin forgets the ``ServerApp`` singleton only when the server's cleanup raised nothing but
``RuntimeError``. A server left with a kernel still starting (a test that failed mid-Continue) raised
something else, and then every later test of that xdist worker met the same server at teardown and
errored there too (346 errors, one cause). Here a kernel still starting is stopped as well (the
server's own cleanup skips the kernels while none has finished starting), and the singleton is always
forgotten: a cleanup error is the error of the test that left it, alone."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def jp_server_cleanup(request: pytest.FixtureRequest) -> Iterator[None]:
    """Stop the test's server, if it made one, and always forget it."""
    try:  # the plugin's loop, as its fixture had it (only where pytest-jupyter is loaded)
        loop = request.getfixturevalue("jp_asyncio_loop")
    except pytest.FixtureLookupError:
        loop = None
    yield
    serverapp = sys.modules.get("jupyter_server.serverapp")
    if serverapp is None or not serverapp.ServerApp.initialized():
        return
    app = serverapp.ServerApp.instance()
    try:
        if loop is not None and not loop.is_closed():
            loop.run_until_complete(_stop_server(app))
    finally:
        km = _kernel_manager(app)
        if km is not None:
            km.context.destroy()
        serverapp.ServerApp.clear_instance()


def _kernel_manager(app: Any) -> Any:
    """The server's kernel manager if it made one (reading the trait would make one)."""
    return app._trait_values.get("kernel_manager")


async def _stop_server(app: Any) -> None:
    km = _kernel_manager(app)
    pending = dict(getattr(km, "_pending_kernels", None) or {})
    try:
        if pending:  # kernels still starting: the server's cleanup would leave them running
            await asyncio.wait_for(km._async_shutdown_all(now=True), timeout=60)
    finally:
        for task in pending.values():
            task.cancel()
        try:
            await app._cleanup()
        except (RuntimeError, SystemExit) as exc:  # as the plugin's fixture: a server never started
            print("ignoring cleanup error", exc)  # noqa: T201
