"""What every cloud VM gets at boot, and the offer ids of zone-addressed clouds.

One format for every provider: the worker reads ``/etc/jupyter-portable/env`` as
``export K=V`` lines, whichever cloud started it.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from typing import Any

from jupyter_portable.core.errors import UsageError

ENV_FILE = "/etc/jupyter-portable/env"
_ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")


def cloud_config(ssh_public_key: str | None, env: Mapping[str, str] | None) -> str | None:
    """cloud-init user data that authorises the key and writes ``env``; None when there is
    nothing to say. JSON is valid YAML, so no value can break out of its string."""
    config: dict[str, Any] = {}
    if ssh_public_key:
        config["ssh_authorized_keys"] = [ssh_public_key.strip()]
    if env:
        bad = [k for k in env if not _ENV_NAME.match(k)]
        if bad:
            raise UsageError(f"not an environment variable name: {', '.join(sorted(bad))}")
        lines = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
        config["write_files"] = [{"path": ENV_FILE, "permissions": "0600", "content": lines}]
    return "#cloud-config\n" + json.dumps(config, indent=1) if config else None


def parse_zone_offer_id(offer_id: str, cloud: str) -> tuple[str, str, bool]:
    """``MACHINE@ZONE[:spot]`` -> (machine, zone, spot): the id alone is enough to launch."""
    base, _, market = offer_id.partition(":")
    machine, _, zone = base.partition("@")
    if not machine or not zone or market not in ("", "spot"):
        raise UsageError(f"not a {cloud} offer id: {offer_id!r} (expected MACHINE_TYPE@ZONE[:spot])")
    return machine, zone, market == "spot"
