"""PUT /portable/api/settings refuses an image of the wrong kind, naming the providers each
setting affects, and stores nothing (issue 27, item 4)."""

# ruff: noqa: F811 - the fixtures imported from jupyter_e2e are taken as arguments of the same name
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import env, jp_root_dir, make_workspace, portable_env, release_all  # noqa: F401 - fixtures

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = pytest.mark.timeout(300)

CONTAINER = "nvcr.io/nvidia/pytorch:24.05-py3"
AMI = "ami-0123456789abcdef0"


async def test_a_wrong_kind_of_image_is_a_400_naming_the_providers(jp_fetch: Any, jp_root_dir: Path) -> None:
    from tornado.httpclient import HTTPClientError

    async def put(body: dict[str, Any]) -> Any:
        return await jp_fetch("portable", "api", "settings", method="PUT", body=json.dumps(body))

    for body, said, hint in [
            ({"container_image": AMI}, "is an AWS machine image (AMI)", "set it as machine_image"),
            ({"machine_image": CONTAINER}, "is a container image", "set it as container_image"),
            ({"image": CONTAINER}, "image is two settings now", "set image as one of those")]:
        with pytest.raises(HTTPClientError) as info:
            await put(body)
        assert info.value.code == 400, body
        error = json.loads(info.value.response.body)
        assert said in error["error"] and hint in error["hint"], error
        assert "RunPod, Vast.ai and the local market" in error["error"] + error["hint"]
        assert "AWS and Google Cloud" in error["error"] + error["hint"]
    stored = json.loads((await jp_fetch("portable", "api", "settings")).body)["requirements"]
    assert (stored["container_image"], stored["machine_image"]) == (None, None)  # nothing was stored
    both = json.loads((await put({"container_image": CONTAINER, "machine_image": AMI})).body)["requirements"]
    assert (both["container_image"], both["machine_image"]) == (CONTAINER, AMI)
