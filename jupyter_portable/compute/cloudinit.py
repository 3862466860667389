"""What every cloud VM gets at boot, and the offer ids of zone-addressed clouds.

One format for every provider: the worker reads ``/etc/jupyter-portable/env`` as
``export K=V`` lines, whichever cloud started it. A provider that takes user data can also
pin the machine's SSH host key: cloud-init's ``ssh_keys`` installs the pair the caller
made, so the first connection already knows whom it talks to.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from jupyter_portable.core.errors import UsageError

ENV_FILE = "/etc/jupyter-portable/env"
_ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
_PRIVATE = re.compile(r"\A-----BEGIN OPENSSH PRIVATE KEY-----\n[A-Za-z0-9+/=\n]+-----END OPENSSH PRIVATE KEY-----\n?\Z")
_PUBLIC = re.compile(r"\Assh-ed25519 [A-Za-z0-9+/]+={0,2}( [^\n]*)?\Z")

HostKey = tuple[str, str]
"""An ed25519 host key pair: (OpenSSH private key text, public key line)."""


def check_host_key(host_key: HostKey) -> HostKey:
    """``host_key`` as (private text, public line), or a UsageError saying what is wrong."""
    try:
        private, public = host_key
    except (TypeError, ValueError):
        raise UsageError("host_key must be a pair: (OpenSSH private key text, public key line)") from None
    if not isinstance(private, str) or not _PRIVATE.match(private.strip() + "\n"):
        raise UsageError("host_key: the private half is not an unencrypted OpenSSH private key",
                         hint="make one with `ssh-keygen -t ed25519 -N ''`")
    if not isinstance(public, str) or not _PUBLIC.match(public.strip()):
        raise UsageError("host_key: the public half is not one `ssh-ed25519 AAAA...` line")
    return private.strip() + "\n", public.strip()


def cloud_config(ssh_public_key: str | None, env: Mapping[str, str] | None, *,
                 host_key: HostKey | None = None,
                 files: Sequence[Mapping[str, str]] = ()) -> str | None:
    """cloud-init user data that authorises the key, writes ``env`` (and ``files``) and
    installs ``host_key`` as the only SSH host key; None when there is nothing to say.
    JSON is valid YAML, so no value can break out of its string."""
    config: dict[str, Any] = {}
    if ssh_public_key:
        config["ssh_authorized_keys"] = [ssh_public_key.strip()]
    if host_key is not None:
        private, public = check_host_key(host_key)
        # with ssh_keys given, cloud-init deletes the image's host keys and writes only these
        config["ssh_deletekeys"] = True
        config["ssh_keys"] = {"ed25519_private": private, "ed25519_public": public}
    written = [dict(f) for f in files]
    if env:
        bad = [k for k in env if not _ENV_NAME.match(k)]
        if bad:
            raise UsageError(f"not an environment variable name: {', '.join(sorted(bad))}")
        lines = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
        written.append({"path": ENV_FILE, "permissions": "0600", "content": lines})
    if written:
        config["write_files"] = written
    return "#cloud-config\n" + json.dumps(config, indent=1) if config else None


def parse_zone_offer_id(offer_id: str, cloud: str) -> tuple[str, str, bool]:
    """``MACHINE@ZONE[:spot]`` -> (machine, zone, spot): the id alone is enough to launch."""
    base, _, market = offer_id.partition(":")
    machine, _, zone = base.partition("@")
    if not machine or not zone or market not in ("", "spot"):
        raise UsageError(f"not a {cloud} offer id: {offer_id!r} (expected MACHINE_TYPE@ZONE[:spot])")
    return machine, zone, market == "spot"
