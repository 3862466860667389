"""When the server starts it sweeps for orphans once, in the background; the state lists them and
``POST /portable/api/orphans {"terminate": ...}`` terminates one, confirmed by the provider (a
RunPod twin: every machine a real loopback sshd)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import make_workspace
from tornado.httpclient import HTTPClientError
from twins.machines import unavailable

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = pytest.mark.timeout(120)

OFFER = {"gpu": "NVIDIA H100 80GB HBM3", "model": "H100 SXM", "memory_mb": 81559, "count": 1, "price": 2.69,
         "driver": "550.90.07", "cuda": "12.4", "stock": 3, "region": "US-TX-3"}


@pytest.fixture
def twin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from twins.runpod import RunPodTwin

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with RunPodTwin(tmp_path / "twin", offers=[OFFER], boot_delay_s=0.2) as t:
        for key, value in t.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("JUPYTER_PORTABLE_PROVIDERS", "runpod")
        yield t


@pytest.fixture
def jp_root_dir(tmp_path: Path, twin: Any) -> Path:
    from jupyter_portable.compute.runpod import RunPodProvider

    root = tmp_path / "workspace"
    ws = make_workspace(root, tmp_path / "store")
    provider = RunPodProvider()
    offer = provider.offers()[0]
    # a machine of this workspace that is not its current allocation (it is IDLE): an orphan
    provider.launch(offer, allocation_id="al-leaked00001", env={"JUPYTER_PORTABLE_WORKSPACE_ID": ws.workspace_id})
    # one of a workspace this store does not know: listed by `machines`, never offered for termination here
    provider.launch(offer, allocation_id="al-elsewhere01", env={"JUPYTER_PORTABLE_WORKSPACE_ID": "ws-another-store"})
    return root


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"jupyter_portable": True}, "allow_unauthenticated_access": False}}


async def test_the_server_sweeps_for_orphans_and_terminates_one(jp_serverapp: Any, jp_fetch: Any, twin: Any,
                                                                jp_root_dir: Path) -> None:
    orphans = None
    for _ in range(300):
        orphans = json.loads((await jp_fetch("portable", "api", "state")).body).get("orphans")
        if orphans is not None and not orphans["sweeping"]:
            break
        await asyncio.sleep(0.1)
    assert orphans is not None and orphans["problems"] == []
    [orphan] = orphans["machines"]
    assert orphan["allocation_id"] == "al-leaked00001" and orphan["orphan"] is True
    assert orphan["spend_source"] == "provider-rate" and orphan["spend"] is not None
    elsewhere = next(ref for ref in twin.running() if ref != orphan["ref"])

    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("portable", "api", "orphans", method="POST",
                       body=json.dumps({"terminate": f"runpod/{elsewhere}"}))
    assert refused.value.code == 400
    done = json.loads((await jp_fetch("portable", "api", "orphans", method="POST",
                                      body=json.dumps({"terminate": f"runpod/{orphan['ref']}"}))).body)
    # confirmed by the provider: RunPod no longer knows the pod
    assert done["ref"] == orphan["ref"] and done["state"] in ("lost", "terminated")
    assert done["orphans"]["machines"] == []
    assert twin.running() == [elsewhere]
    state = json.loads((await jp_fetch("portable", "api", "state")).body)
    assert state["orphans"]["machines"] == []
