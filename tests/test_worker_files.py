"""``PUT /files`` on a real worker agent process: names and paths the filesystem cannot hold
get a 400 that says what is wrong, never a 500."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import write_tree

from jupyter_portable import Workspace
from jupyter_portable.core.errors import UsageError
from jupyter_portable.worker.protocol import READY_PREFIX

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[httpx.Client, Path]]:
    src = tmp_path / "src"
    write_tree(src, {"train.py": "pass\n"})
    ws = Workspace.init(src, f"file://{tmp_path}/store")
    ws.snapshot(progress=None)
    epoch = ws.store.claim_epoch(ws.workspace_id)
    work = tmp_path / "work"
    config = {"store": ws.config.store, "workspace_id": ws.workspace_id, "allocation_id": "al-files",
              "version": 1, "epoch": epoch, "workdir": str(work), "state_dir": str(tmp_path / "agent")}
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_portable.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(config))
    proc.stdin.close()
    line = proc.stdout.readline()
    assert line.startswith(READY_PREFIX), line
    ready = json.loads(line[len(READY_PREFIX):])
    client = httpx.Client(base_url=f"http://127.0.0.1:{ready['port']}", timeout=30,
                          headers={"Authorization": f"token {ready['token']}"})
    try:
        for _ in range(600):
            phase = client.get("/status").json()["phase"]
            if phase in ("ready", "failed"):
                break
            time.sleep(0.1)
        assert phase == "ready"
        yield client, work
    finally:
        client.close()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _put(client: httpx.Client, path: str) -> httpx.Response:
    return client.put("/files", json={"path": path, "content": base64.b64encode(b"x = 1\n").decode(), "base": None})


@pytest.mark.parametrize(("path", "said"), [
    ("n" * 300 + ".py", "is 303 bytes; this filesystem allows at most 255"),
    ("deep/" + "é" * 200 + ".py", "is 403 bytes; this filesystem allows at most 255"),
    ("d/" * 1500 + "x.py", "is 1501 levels deep; the worker takes at most 256"),
    ("/".join(["d" * 200] * 25) + "/x.py", "bytes long on the worker; the limit there is 4095"),
])
def test_a_path_the_filesystem_cannot_hold_is_a_400_naming_the_problem(
        agent: tuple[httpx.Client, Path], path: str, said: str) -> None:
    client, work = agent
    resp = _put(client, path)
    body: dict[str, Any] = resp.json()
    assert resp.status_code == 400, body
    assert said in body["error"] and body["hint"] and len(body["error"]) < 300
    assert sorted(p.name for p in work.iterdir()) == [".portable", "train.py"]  # nothing was written


def test_a_name_at_the_limit_is_written(agent: tuple[httpx.Client, Path]) -> None:
    client, work = agent
    name = "n" * 252 + ".py"
    resp = _put(client, f"sub/{name}")
    assert resp.status_code == 200, resp.text
    assert (work / "sub" / name).read_bytes() == b"x = 1\n"


@pytest.mark.parametrize("endpoint", [("POST", "/read"), ("POST", "/fetch"), ("PUT", "/files")])
@pytest.mark.parametrize(("path", "said"), [
    ("a" * 5000, "is 5000 bytes; this filesystem allows at most 255"),
    ("d/" * 2499 + "x", "is 2500 levels deep"),
    ("/".join(["d" * 200] * 25), "the limit there is 4095"),
])
def test_a_path_of_5000_characters_is_a_400_on_every_endpoint_that_takes_a_path(
        agent: tuple[httpx.Client, Path], endpoint: tuple[str, str], path: str, said: str) -> None:
    client, work = agent
    method, url = endpoint
    body: dict[str, Any] = {"path": path}
    if url == "/files":
        body.update(content=base64.b64encode(b"x").decode(), base=None)
    resp = client.request(method, url, json=body)
    assert resp.status_code == 400, resp.text
    assert said in resp.json()["error"]
    assert sorted(p.name for p in work.iterdir()) == [".portable", "train.py"]


@pytest.mark.parametrize("endpoint", [("POST", "/read"), ("POST", "/fetch"), ("PUT", "/files"), ("POST", "/snapshot"),
                                      ("POST", "/kernel"), ("POST", "/seal")])
def test_a_deeply_nested_body_is_a_400_not_a_500(agent: tuple[httpx.Client, Path], endpoint: tuple[str, str]) -> None:
    client, work = agent
    method, url = endpoint
    deep = b"[" * 100_000 + b"]" * 100_000
    resp = client.request(method, url, content=b'{"path": ' + deep + b"}")
    assert resp.status_code == 400, resp.text
    assert "nested too deeply" in resp.json()["error"]
    assert client.get("/status").json()["phase"] == "ready"  # the worker still serves


def test_a_malformed_body_on_every_worker_route_is_the_servers_400(agent: tuple[httpx.Client, Path]) -> None:
    """Issue 46: the worker's API checks bodies with the server's machinery (core.bodies) and answers
    errors from the server's table (core.http_status): every route that takes a body refuses a body
    that is not an object, and an unknown field, with the server's own words and answer shape."""
    from jupyter_portable.interfaces.serverext import requests as server
    from jupyter_portable.worker.api import ROUTES

    client, work = agent
    shape = server.validator("error.json")
    taking = [(method.upper(), path) for path, handler in ROUTES for method in ("post", "put", "delete")
              if method in vars(handler)]
    assert sorted(taking) == [("DELETE", "/kernel"), ("POST", "/activity"), ("POST", "/fetch"), ("POST", "/kernel"),
                              ("POST", "/kernel/signal"), ("POST", "/read"), ("POST", "/seal"), ("POST", "/shutdown"),
                              ("POST", "/snapshot"), ("PUT", "/credentials"), ("PUT", "/files")]
    for raw, said in ((b"[1]", "the body must be a JSON object"),
                      (b'{"zz_unknown": 1}', "unknown field(s): zz_unknown")):
        with pytest.raises(UsageError) as by_server:  # what the server's own reader says of the same body
            server.read_body(raw, "empty-request.json")
        assert str(by_server.value) == said
        for method, path in taking:
            resp = client.request(method, path, content=raw)
            assert resp.status_code == 400, (method, path, resp.text)
            assert shape.is_valid(resp.json()), (method, path, resp.text)
            assert resp.json() == {"error": said, "hint": None}, (method, path)
    # a field of the wrong type is named as the server names it; nothing was acted on, and the worker serves
    resp = client.post("/kernel/signal", json={"signum": "TERM"})
    assert resp.status_code == 400 and resp.json()["error"] == "signum must be a whole number from 1 to 64, not 'TERM'"
    assert client.get("/status").json()["phase"] == "ready"
    assert sorted(p.name for p in work.iterdir()) == [".portable", "train.py"]


def _raw_put(port: int, token: str, body: bytes) -> tuple[bytes, bool]:
    """``PUT /files`` with ``body`` over a plain socket: the status line the agent answers, and
    whether it closed the connection before the whole body was sent."""
    import socket

    head = (f"PUT /files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: token {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        cut = False
        try:
            sock.sendall(head + body)
        except (BrokenPipeError, ConnectionResetError):
            cut = True
        answer = b""
        try:
            while b"\r\n" not in answer:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
        except ConnectionResetError:
            pass
    return answer.split(b"\r\n", 1)[0], cut


def test_a_body_past_the_workers_64_mib_limit_is_refused_before_it_is_read(
        agent: tuple[httpx.Client, Path]) -> None:
    """Issue 40: the agent's 64 MiB limit was set where tornado ignores it (the application's
    settings), so the 100 MB default held and a 70 MiB edit was written. Now the server refuses it
    from its Content-Length, and nothing reaches the worker's copy."""
    from jupyter_portable.worker.api import MAX_BODY

    client, work = agent
    port, token = int(str(client.base_url).rsplit(":", 1)[1].rstrip("/")), client.headers["Authorization"].split()[1]
    content = b"#" * (MAX_BODY * 3 // 4 + 2**20)  # base64 makes it past the limit, and under tornado's 100 MB
    body = json.dumps({"path": "big.py", "content": base64.b64encode(content).decode(), "base": None}).encode()
    assert MAX_BODY < len(body) < 100 * 10**6
    status, _ = _raw_put(port, token, body)
    assert status.startswith(b"HTTP/1.1 400"), status
    assert not (work / "big.py").exists()
    # an edit under the limit is still taken
    resp = client.put("/files", json={"path": "small.py", "content": base64.b64encode(b"#" * 2**20).decode(),
                                      "base": None})
    assert resp.status_code == 200, resp.text
    assert (work / "small.py").stat().st_size == 2**20
