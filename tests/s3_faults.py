"""A fault-injecting HTTP proxy on loopback, in front of the moto S3 server.

Each request draws from a seeded generator: at ``rate`` it gets one of the faults a
real S3 gives (503 SlowDown, a 500 after the request was applied, a connection reset
before or after it was applied, a truncated body, latency); otherwise it is forwarded
untouched. Rules added with :meth:`FaultProxy.once` / :meth:`FaultProxy.always` fire
on matching requests whatever the rate, for tests of one exact fault.
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

# Not applied: the request never reaches the store.
BEFORE = ("slowdown", "reset_before")
# Applied: the store did the work, the client does not learn it.
AFTER = ("error_after", "reset_after", "truncate")
KINDS = BEFORE + AFTER + ("latency",)

_SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
_INTERNAL = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
             b"<Message>We encountered an internal error. Please try again.</Message></Error>")


@dataclass
class Rule:
    """A fault for requests matching ``method`` and containing ``path`` (and ``header``)."""

    kind: str
    method: str | None = None
    path: str = ""
    header: str | None = None
    times: int | None = 1  # None: every match
    hook: Callable[[], None] | None = None  # run before forwarding (e.g. a racing writer)

    def matches(self, method: str, path: str, headers: dict[str, str]) -> bool:
        return ((self.method is None or self.method == method) and self.path in path
                and (self.header is None or self.header.lower() in headers))


@dataclass
class Counts:
    requests: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    puts: int = 0  # PUT and POST requests forwarded with a body
    put_bytes: int = 0  # their bodies' bytes: what was written to the store

    @property
    def injected(self) -> int:
        return sum(n for kind, n in self.faults.items() if kind != "latency")


class FaultProxy:
    """``http://127.0.0.1:PORT`` forwarding to ``upstream`` with injected faults."""

    def __init__(self, upstream: str, *, rate: float = 0.0, seed: int = 0,
                 kinds: tuple[str, ...] = KINDS, latency_s: float = 0.05) -> None:
        up = urlparse(upstream)
        self.upstream = (up.hostname or "127.0.0.1", up.port or 80)
        self.rate = rate
        self.kinds = kinds
        self.latency_s = latency_s
        self.rng = random.Random(seed)
        self.rules: list[Rule] = []
        self.counts = Counts()
        self._lock = threading.Lock()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> "FaultProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def once(self, kind: str, **match: object) -> Rule:
        rule = Rule(kind, **match)  # type: ignore[arg-type]
        with self._lock:
            self.rules.append(rule)
        return rule

    def always(self, kind: str, **match: object) -> Rule:
        return self.once(kind, times=None, **match)

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def choose(self, method: str, path: str, headers: dict[str, str]) -> tuple[str | None, Rule | None]:
        with self._lock:
            self.counts.requests += 1
            for rule in self.rules:
                if rule.matches(method, path, headers) and (rule.times is None or rule.times > 0):
                    if rule.times is not None:
                        rule.times -= 1
                    self.counts.faults[rule.kind] += 1
                    return rule.kind, rule
            if self.rate and self.rng.random() < self.rate:
                kind = self.rng.choice(self.kinds)
                self.counts.faults[kind] += 1
                return kind, None
        return None, None


class _Handler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the head and body are two writes: no 40 ms wait for an ACK

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _reset(self) -> None:
        # SO_LINGER 0: close sends RST, as a dropped connection does.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        try:
            self.connection.close()
        except OSError:
            pass

    def _error(self, status: int, body: bytes) -> None:
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in ("expect", "transfer-encoding", "connection", "content-length")}
        try:
            conn.request(self.command, self.path, body=body if body or self.command in ("PUT", "POST") else None,
                         headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.getheaders(), data
        finally:
            conn.close()

    def _handle(self) -> None:
        body = self._body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        kind, rule = self.owner.choose(self.command, self.path, headers)
        if self.command in ("PUT", "POST") and body:
            with self.owner._lock:
                self.owner.counts.puts += 1
                self.owner.counts.put_bytes += len(body)
        if rule is not None and rule.hook is not None:
            rule.hook()
        if kind == "slowdown":
            self._error(503, _SLOWDOWN)
            return
        if kind == "reset_before":
            self._reset()
            return
        if kind == "latency":
            time.sleep(self.owner.latency_s)
        status, resp_headers, data = self._forward(body)
        if kind == "error_after":
            self._error(500, _INTERNAL)
            return
        if kind == "reset_after" or (kind == "truncate" and (len(data) < 2 or self.command == "HEAD")):
            self._reset()
            return
        self.send_response_only(status)
        for k, v in resp_headers:
            if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if kind == "truncate":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self._reset()
            return
        self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle  # noqa: N815
