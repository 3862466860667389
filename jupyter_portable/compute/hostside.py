"""The host's half of the ``ssh`` provider: stdlib-only functions run on the user's own host.

The provider streams this file's source to the host's ``python3 -``, followed by one call,
``print(json.dumps(FUNCTION(json.loads(PAYLOAD))))``: the payload is a literal in the program, so
arguments (and the worker's environment) never appear on any command line, and the answer is the
last line of stdout. Nothing here may import beyond the standard library, and it must run on any
Python 3.7 or later: it runs before this package exists on the host.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

__all__ = ["launch", "ours", "status", "terminate"]


def ours(pid: int, allocation: str) -> bool:
    """Is pid alive and our worker for this allocation (not a reused PID, not a zombie)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = fh.read().decode(errors="replace").split("\0")
    except OSError:
        proc = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True)
        args = proc.stdout.split()
    return "--allocation" in args and allocation in args


def launch(p: dict[str, Any]) -> dict[str, Any]:
    """Write the worker stub, start it in a session of its own, and wait for its first heartbeat."""
    root = os.path.expanduser(p["workdir"])
    d = os.path.join(os.path.abspath(root), "allocations", p["allocation"])
    os.makedirs(d, exist_ok=True)
    for name in ("agent.json", "heartbeat", "stopped"):
        try:
            os.remove(os.path.join(d, name))
        except FileNotFoundError:
            pass
    src = os.path.join(d, "agent_stub.py")
    with open(src + ".tmp", "w") as fh:
        fh.write(p["source"])
    os.replace(src + ".tmp", src)
    # core/secretenv's allow-list, as is_allowed reads it: the host's own secrets, and names no list
    # foresaw, stay out of the stub, whose environment a kernel of the same user can read
    names, prefixes = set(p["allowed_names"]), tuple(p["allowed_prefixes"])
    secrets, suffixes = set(p["secret_names"]), tuple(p["secret_suffixes"])
    env = {k: v for k, v in os.environ.items()
           if (k in names or k.startswith(prefixes)) and k.upper() not in secrets and not k.upper().endswith(suffixes)}
    env.update(p["env"])
    # A session of its own: the worker outlives this SSH connection and gets no SIGHUP.
    with open(src, "rb") as stdin, open(os.path.join(d, "agent.log"), "ab") as log:
        proc = subprocess.Popen([sys.executable, "-", "--dir", d, "--allocation", p["allocation"]], stdin=stdin,
                                stdout=log, stderr=subprocess.STDOUT, cwd=d, env=env, start_new_session=True)
    out = {"remote_dir": d, "pid": proc.pid}
    deadline = time.time() + p["wait"]
    while True:
        # The heartbeat is written after agent.json is closed: once it exists, agent.json is whole.
        if os.path.exists(os.path.join(d, "heartbeat")):
            with open(os.path.join(d, "agent.json")) as fh:
                out["agent"] = json.load(fh)
            break
        if proc.poll() is not None:
            out["error"] = f"the worker exited with status {proc.returncode}"
            break
        if time.time() > deadline:
            out["error"] = f"the worker wrote no heartbeat within {p['wait']:g}s"
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    if "error" in out:
        try:
            with open(os.path.join(d, "agent.log"), errors="replace") as fh:
                out["log"] = fh.read()[-1500:]
        except OSError:
            pass
    return out


def status(p: dict[str, Any]) -> dict[str, Any]:
    """Whether the worker runs, its last heartbeat (the host's clock), and whether it stopped."""
    out = {"now": time.time(), "alive": ours(p["pid"], p["allocation"]), "heartbeat": None,
           "stopped": os.path.exists(os.path.join(p["remote_dir"], "stopped"))}
    try:
        with open(os.path.join(p["remote_dir"], "heartbeat")) as fh:
            out["heartbeat"] = float(fh.read().strip())
    except (OSError, ValueError):
        pass
    return out


def terminate(p: dict[str, Any]) -> dict[str, Any]:
    """SIGTERM the worker's session, SIGKILL after ``grace`` seconds; whether it is gone."""
    pid, allocation = p["pid"], p["allocation"]
    out = {"was_running": ours(pid, allocation), "killed": False}

    def signal_worker(sig: int) -> None:
        # The worker leads its own session; signalling the group also stops what it started.
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def wait_gone(seconds: float) -> bool:
        deadline = time.time() + seconds
        while ours(pid, allocation):
            if time.time() > deadline:
                return False
            time.sleep(0.05)
        return True

    if out["was_running"]:
        signal_worker(signal.SIGTERM)
        if not wait_gone(p["grace"]):
            signal_worker(signal.SIGKILL)
            out["killed"] = True
            wait_gone(5)
    out["gone"] = not ours(pid, allocation)
    return out
