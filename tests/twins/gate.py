"""A firewall in front of a twin machine's sshd: a TCP port that lets a connection through only when
a rule admits the address it comes from, as a cloud's security group or firewall does.

Every client on loopback connects from 127.0.0.1, so where a connection "comes from" is what the
twin says the user's public address is (``source()``, asked as each connection arrives): the
address a NAT on the way would show the provider. A connection that no rule admits is closed at
once; a real security group drops its packets and the client waits for its own timeout instead,
which a test would only spend time on. :meth:`Gate.cut` ends the connections open now, as moving
to another network does to a laptop's.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable


class Gate:
    """Listen on ``host:port`` and forward each admitted connection to ``target``."""

    def __init__(self, host: str, port: int, target: tuple[str, int], admits: Callable[[], bool]) -> None:
        self.target = target
        self.admits = admits
        self.refused = 0  # connections no rule admitted
        self.passed = 0
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        # raises OSError(EADDRINUSE) when the port is taken: the caller picks another address
        self._sock = socket.create_server((host, port), reuse_port=False)
        self._thread = threading.Thread(target=self._accept, name=f"gate-{host}:{port}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            try:
                admitted = self.admits()
            except Exception:  # noqa: BLE001 - a twin without an answer admits nothing
                admitted = False
            if not admitted:
                self.refused += 1
                conn.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                conn.close()
                continue
            self.passed += 1
            with self._lock:
                self._open.update((conn, upstream))
            ended: list[int] = []  # directions of this pair that reached their end
            for src, dst in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(src, dst, ended), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, ended: list[int]) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(src, dst)
            return
        with self._lock:
            ended.append(1)
            both = len(ended) == 2
        if both:
            self._drop(src, dst)

    def _drop(self, *socks: socket.socket) -> None:
        for sock in socks:
            with self._lock:
                self._open.discard(sock)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def cut(self) -> None:
        """End every connection open now (the client's address is gone)."""
        with self._lock:
            socks = list(self._open)
        self._drop(*socks)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.close()
        self.cut()
