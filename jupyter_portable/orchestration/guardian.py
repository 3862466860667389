"""The user side of the guardian on the machine (``core/guardian``, ``worker/guardian``): the policy a
worker is given when it starts, and what the machine did while this side was away, read back when it
returns.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from jupyter_portable.compute.base import Allocation, Provider
from jupyter_portable.core.errors import PortableError, UsageError
from jupyter_portable.core.guardian import GuardianPolicy, means_for, release_words
from jupyter_portable.core.validate import check_number
from jupyter_portable.engine.workspace import Workspace

IDLE_HOOK = "JUPYTER_PORTABLE_GUARDIAN_IDLE_MINUTES"  # a test hook: the guardian's idle window, in minutes


def policy_for(ws: Workspace, allocation: Allocation, provider: Provider) -> dict[str, Any]:
    """The ``guardian`` a worker on ``allocation`` starts with: the workspace's idle minutes, the money
    its budget has left (spend estimated, no provider asked), the machine's price, this server's
    ``c.Portable.absent_grace``, and the means its provider gives the machine to stop itself."""
    from jupyter_portable.core.envconfig import PortableRun
    from jupyter_portable.orchestration.budget import budget_report
    from jupyter_portable.orchestration.settings import load_settings

    settings = load_settings(ws)
    head, _ = ws.store.read_head(ws.workspace_id)
    manifest = ws.store.read_manifest(ws.workspace_id, head.version) if head.version else None
    rec: dict[str, Any] = next((a for a in reversed(manifest.allocations if manifest else ())
                if a.get("allocation_id") == allocation.allocation_id), {})
    price = rec.get("price_per_hour")
    price_per_hour = float(price) if isinstance(price, (int, float)) and not isinstance(price, bool) else None
    started = rec.get("started") if isinstance(rec.get("started"), str) else None
    left = None
    with contextlib.suppress(PortableError):
        left = budget_report(ws, figure=lambda _a: None).get("left")
    api = getattr(getattr(provider, "_api", None), "base_url", None)
    means = means_for(allocation.provider)
    idle_minutes = float(settings.idle_minutes or 0)
    hook = os.environ.get(IDLE_HOOK)
    if hook:  # tests and demos: an idle window of seconds, where the setting takes whole minutes
        try:
            idle_minutes = float(check_number(float(hook), IDLE_HOOK, minimum=0.0, error=UsageError))
        except ValueError:
            raise UsageError(f"{IDLE_HOOK} must be minutes, got {hook!r}") from None
    return GuardianPolicy(provider=allocation.provider, means=means, idle_minutes=idle_minutes,
                          absent_grace_s=PortableRun.current().absent_grace,
                          budget_left=None if left is None else max(0.0, float(left)),
                          price_per_hour=price_per_hour, api_url=api if isinstance(api, str) else None,
                          started=started).to_json()


def machine_release(ws: Workspace, allocation_id: str | None) -> dict[str, Any] | None:
    """What the machine of ``allocation_id`` recorded when it released itself (the head's allocation
    record's ``released_by``, with ``message``: the words the sidebar and the CLI show); None if it did not."""
    if not allocation_id:
        return None
    head, _ = ws.store.read_head(ws.workspace_id)
    if not head.version:
        return None
    manifest = ws.store.read_manifest(ws.workspace_id, head.version)
    rec = next((a for a in reversed(manifest.allocations) if a.get("allocation_id") == allocation_id), None)
    released = rec.get("released_by") if rec else None
    if not isinstance(released, dict):
        return None
    return {**released, "allocation_id": allocation_id, "message": release_words(released)}


__all__ = ["machine_release", "policy_for"]
