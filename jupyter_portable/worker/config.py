"""The agent's command line and configuration: checked before anything starts, and ``--detach``,
which starts the agent in a session of its own and returns once it listens. Light on imports:
the detaching process starts an interpreter of its own before the agent's, on every Continue."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jupyter_portable.core.errors import UsageError
from jupyter_portable.worker.protocol import READY_PREFIX


def check_config(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise UsageError("the agent's configuration must be a JSON object")
    for key in ("store", "workspace_id", "allocation_id", "workdir", "state_dir"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise UsageError(f"the agent's configuration needs {key!r}")
    for key in ("version", "epoch"):
        if not isinstance(obj.get(key), int) or obj[key] < 0:
            raise UsageError(f"the agent's configuration needs a non-negative integer {key!r}")
    environment = obj.get("environment") or {"mode": "image"}
    if not isinstance(environment, dict) or environment.get("mode") not in ("auto", "image", "lockfile", "exact"):
        raise UsageError('environment must be {"mode": "auto"}, {"mode": "image"}, {"mode": "exact"} or '
                         '{"mode": "lockfile", ...}')
    env = obj.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise UsageError("env must map names to text")
    if obj.get("pass_env") is not None:
        from jupyter_portable.core.secretenv import pass_names

        if not isinstance(obj["pass_env"], list):
            raise UsageError("pass_env must be a list of variable names")
        obj["pass_env"] = list(pass_names(obj["pass_env"], "pass_env"))
    if obj.get("credentials") is not None:
        from jupyter_portable.store.credentials import SessionCredentials

        SessionCredentials.from_json(obj["credentials"])
    if obj.get("guardian") is not None:  # the workspace's policy for a machine whose user side is away
        from jupyter_portable.core.guardian import GuardianPolicy

        obj["guardian"] = GuardianPolicy.from_json(obj["guardian"]).to_json()
    if obj.get("machine_key") is not None:  # put there by --detach on the machine, never sent by the user side
        from jupyter_portable.worker.guardian import check_machine_key

        check_machine_key(obj["machine_key"])
    return obj


def machine_env(config: dict[str, Any]) -> tuple[dict[str, str], set[str]]:
    """What of this machine's environment the worker keeps: what core.secretenv allows, and the
    names passed on purpose (the user's ``pass_env`` and the machine's own
    ``JUPYTER_PORTABLE_PASS_ENV``); with the user's names."""
    from jupyter_portable.core.secretenv import PASS_ENV, pass_names, scrubbed

    sent = set(config.get("pass_env") or ())
    try:
        own = set(pass_names(os.environ.get(PASS_ENV), f"the machine's {PASS_ENV}"))
    except UsageError:
        own = set()  # the machine's own setting is unreadable: it keeps nothing beyond the allow-list
    return scrubbed(os.environ, sent | own), sent


def main(argv: list[str] | None = None) -> int | dict[str, Any]:
    """The command line: an exit status when this process is done (a bad configuration, or
    ``--detach`` once the agent listens), else the checked configuration for the agent to run
    here (``__main__`` hands it to ``daemon.run``: the server's imports only in the agent)."""
    parser = argparse.ArgumentParser(prog="python -m jupyter_portable.worker",
                                     description="the jupyter-portable worker agent (configuration on stdin)")
    parser.add_argument("--detach", action="store_true",
                        help="start the agent in a session of its own, print its ready line, and return")
    args = parser.parse_args(argv)
    raw = sys.stdin.read()
    try:
        config = check_config(json.loads(raw))
    except (ValueError, UsageError) as exc:
        print(f"jupyter-portable worker: bad configuration: {exc}", file=sys.stderr)
        return 2
    if args.detach:
        return detach(_with_machine_key(raw, config), Path(config["state_dir"]).expanduser(), machine_env(config)[0])
    return config


def _with_machine_key(raw: str, config: dict[str, Any]) -> str:
    """The configuration with the machine's own key (worker/guardian) where its provider put one: it
    reaches the agent over stdin, not through an environment its kernel would inherit."""
    from jupyter_portable.worker.guardian import find_machine_key

    if config.get("guardian") is None:
        return raw
    key = find_machine_key(config["guardian"].get("means"), os.environ)
    return raw if key is None else json.dumps({**config, "machine_key": key})


def detach(raw: str, state_dir: Path, env: dict[str, str], timeout: float = 60.0) -> int:
    # started with only what it keeps: what the worker drops is not left in its /proc/PID/environ either
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_portable.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(raw.encode())
    proc.stdin.close()
    deadline = time.monotonic() + timeout
    line = b""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(READY_PREFIX.encode()) or not line:
            break
    if not line.startswith(READY_PREFIX.encode()):
        tail = ""
        with contextlib.suppress(OSError):
            tail = (state_dir / "agent.log").read_text(errors="replace")[-800:]
        print(f"jupyter-portable worker: the agent did not come up: {tail}", file=sys.stderr)
        return 1
    sys.stdout.write(line.decode())
    sys.stdout.flush()
    return 0
