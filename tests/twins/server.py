"""What every provider twin shares: an HTTP server on 127.0.0.1, the published-schema checks,
the key check, a rate limit, and the rented machines' lifecycle.

A twin is a stateful imitation of a provider's API, good enough to drive the real provider
module end to end. Every request is checked against its operation's published request schema
(``tests/twins/schemas.py``): one the real API would refuse gets that provider's documented
error and is recorded in :attr:`Twin.violations`. Every response the twin sends is checked
against the published response schema first; a twin bug answers 500 and is recorded in
:attr:`Twin.bugs`, which leaving the ``with`` block raises.

Each launch rents a real machine (``tests/twins/machines.py``): its sshd starts in the
background at once, and the API reports it running only after ``boot_delay_s`` on the twin's
clock, with an SSH endpoint only once that sshd listens. The machine's login user is the twin's
:attr:`Twin.login_user`; its Python is the one the launch's image has (``images``, image name ->
interpreter path), else the offer's (:attr:`TwinOffer.python`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from sshd import SSHD, _free_port

from twins import schemas
from twins.machines import BARE_PYTHON, TwinMachine, start_machine


@dataclass
class TwinOffer:
    """One kind of machine a twin rents out, and how many are free (``stock``).

    ``gpu`` is the name nvidia-smi shows (and RunPod's GPU type id); ``model`` the short name
    the marketplaces list ("RTX 4090"); ``memory_mb`` per GPU; ``count`` GPUs per machine;
    ``price`` $/h for the machine; ``region`` a data center / region / geolocation; ``python`` the
    bare interpreter its machines have (a path, e.g. ``machines.PYTHONS["3.10"]``)."""

    gpu: str = "NVIDIA GeForce RTX 4090"
    model: str = "RTX 4090"
    memory_mb: int = 24564
    count: int = 1
    price: float = 0.69
    driver: str = "550.54.15"
    cuda: str = "12.4"
    stock: int = 1
    region: str = "US-TX-3"
    python: str = BARE_PYTHON

    @classmethod
    def of(cls, spec: TwinOffer | dict[str, Any]) -> TwinOffer:
        return spec if isinstance(spec, TwinOffer) else cls(**spec)

    @property
    def gpus(self) -> list[dict[str, Any]]:
        return [{"name": self.gpu, "memory_mb": self.memory_mb} for _ in range(self.count)]


@dataclass
class Reply:
    """One answer: status, JSON body (None: no body), headers. ``undocumented`` marks an answer the
    document has no entry for (an injected 5xx, a 429 where none is listed): its body is checked
    against the twin's ``error_schema`` instead."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    undocumented: bool = False


class Refused(Exception):
    """Raised by an operation to answer with ``reply`` (an error the document lists)."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(f"HTTP {reply.status}")
        self.reply = reply


@dataclass
class Rental:
    """One rented machine as the twin's books keep it."""

    ref: str
    offer: TwinOffer
    created: float
    # the provider's own record of when the machine was rented (what spend figures count from):
    # on the twin's wall clock, as first reported running, taken back and deleted below
    created_at: datetime
    name: str
    keys: list[str] = field(default_factory=list)
    machine: TwinMachine | None = None
    start_error: str | None = None
    deleted: bool = False
    killed: str | None = None
    deletes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    running_at: datetime | None = None
    killed_at: datetime | None = None
    deleted_at: datetime | None = None
    restarts: int = 0

    def billed(self, until: datetime | None = None) -> float:
        """What the provider charges for it: its price from creation to deletion, or to ``until``
        (a time on the twin's wall clock) while it still runs."""
        end = self.deleted_at or until
        if end is None:
            raise ValueError(f"{self.ref} still runs: say until when it is billed (the twin's wall)")
        return self.offer.price * max(0.0, (end - self.created_at).total_seconds()) / 3600

    @property
    def created_iso(self) -> str:
        return self.created_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Twin:
    """Base of the provider twins; a context manager that starts the server and, on exit, stops
    it and removes every machine. Subclasses set ``provider``, ``key_env``, ``url_env`` and
    implement :meth:`handle` and the provider's error bodies."""

    provider = ""
    key_env = ""
    url_env = ""
    # the answer the document has no schema for (injected faults, undocumented 429s)
    error_schema: Any = {"type": "object"}
    # the operations that rent a machine (whose answer ``lose_answers`` drops)
    launch_ops: frozenset[str] = frozenset()
    # who logs in to the machines: the provider's images' user
    login_user = "root"
    # what a machine's own key (:meth:`machine_key`) may call, and only on that machine (path id = its ref)
    machine_key_ops: frozenset[str] = frozenset()

    def __init__(self, root: Path, *, offers: Iterable[TwinOffer | dict[str, Any]] | None = None,
                 boot_delay_s: float = 1.0, clock: Callable[[], float] = time.monotonic, rate: float | None = None,
                 fail_first_delete: Iterable[str] | bool = (), api_key: str | None = None,
                 lose_answers: int = 0, gateway_errors: int = 0, images: dict[str, str] | None = None,
                 wall: Callable[[], datetime] = lambda: datetime.now(timezone.utc), gateway_status: int = 503,
                 listing_lag_s: float = 0.0) -> None:
        self.root = Path(root)
        self.wall = wall  # the provider's calendar: what its records and bills are dated by
        self.images = dict(images or {})  # image name -> the bare interpreter its machines have
        self.offers = [TwinOffer.of(o) for o in (offers if offers is not None else [TwinOffer()])]
        self.boot_delay_s = boot_delay_s
        self.clock = clock
        self.rate = rate
        self.fail_first_delete: set[str] | bool = (fail_first_delete if isinstance(fail_first_delete, bool)
                                                   else set(fail_first_delete))
        self.api_key = api_key or f"twin-{self.provider}-{secrets.token_hex(8)}"
        self.rentals: dict[str, Rental] = {}
        # this many successful launches are carried out, then the connection drops unanswered
        self.lose_answers = lose_answers
        # this many successful launches are carried out, then a gateway in front answers 503 instead
        self.gateway_errors = gateway_errors
        self.gateway_status = gateway_status  # what that gateway answers: 503, or the API's own 500
        # a new machine is listed only this long (on ``clock``) after its launch: a listing lags (issue 42)
        self.listing_lag_s = listing_lag_s
        self.machine_keys: dict[str, str] = {}  # a machine's own key -> the ref of the one machine it may act on
        self.requests: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self.bugs: list[str] = []
        self.lock = threading.RLock()
        self._tokens = float(rate or 0)
        self._refilled = clock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._starting: list[threading.Thread] = []
        self._seq = 0

    # -- what tests use ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "the twin is not started: use it in a with block"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def env(self) -> dict[str, str]:
        """Environment variables that point the provider at this twin (API key and base URL)."""
        return {self.key_env: self.api_key, self.url_env: self.url}

    @property
    def machines(self) -> dict[str, TwinMachine]:
        """ref -> the machine, for every rental whose machine started."""
        with self.lock:
            return {ref: r.machine for ref, r in self.rentals.items() if r.machine is not None}

    def running(self) -> list[str]:
        """Refs of the rentals not deleted (a killed one stays until the provider deletes it)."""
        with self.lock:
            return [ref for ref, r in self.rentals.items() if not r.deleted]

    def kill(self, ref: str, reason: str = "the host was reclaimed") -> None:
        """The provider takes the machine back: every process on it dies and the API reports the
        provider's lost state (with ``reason`` where the API carries one)."""
        with self.lock:
            rental = self.rentals[str(ref)]
            rental.killed = reason
            rental.killed_at = self.wall()
        self._wait_started(rental)
        if rental.machine is not None:
            rental.machine.kill()
        self.on_kill(rental)

    def set_stock(self, model: str, stock: int) -> None:
        """How many machines of the offers whose ``model`` or ``gpu`` is ``model`` are free now."""
        with self.lock:
            found = [o for o in self.offers if model in (o.model, o.gpu)]
            if not found:
                raise KeyError(f"no twin offer {model!r}")
            for offer in found:
                offer.stock = stock
                self.on_stock(offer)

    def start(self) -> Twin:
        self.root.mkdir(parents=True, exist_ok=True)
        twin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # the head and body are two writes: no 40 ms wait for an ACK

            def _any(self) -> None:
                twin._serve(self)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # the request log is twin.requests

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"{self.provider}-twin", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for thread in list(self._starting):
            thread.join(30)
        with self.lock:
            rentals = list(self.rentals.values())
        for rental in rentals:
            if rental.machine is not None:
                rental.machine.remove()
            self.on_remove(rental)

    def __enter__(self) -> Twin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
        if self.bugs and exc[0] is None:
            raise AssertionError(f"{self.provider} twin answered outside its published schema: {self.bugs}")

    # -- the machines --------------------------------------------------------------------------

    def machine_key(self, ref: str) -> str:
        """A new key scoped to the machine ``ref``: it may call :attr:`machine_key_ops` on that machine only."""
        key = f"twin-{self.provider}-machine-{secrets.token_hex(12)}"
        with self.lock:
            self.machine_keys[key] = ref
        return key

    def machine_env(self, rental: Rental) -> dict[str, str]:
        """What the provider puts in the environment of every process on ``rental``'s machine."""
        return {}

    def new_ref(self) -> str:
        with self.lock:
            self._seq += 1
            return f"{self._seq}{secrets.token_hex(4)}"

    def rent(self, offer: TwinOffer, ref: str, *, name: str, keys: Iterable[str] = (), fail_with: str | None = None,
             **extra: Any) -> Rental:
        """Take one of ``offer``'s stock and start its machine in the background (``fail_with``: it
        never starts, for that reason)."""
        with self.lock:
            offer.stock -= 1
            self.on_stock(offer)
            rental = Rental(ref=ref, offer=offer, created=self.clock(), name=name,
                            keys=[k for k in keys if k.strip()], extra=extra, created_at=self.wall(),
                            start_error=fail_with)
            self.rentals[ref] = rental
        thread = threading.Thread(target=self._boot, args=(rental,), name=f"boot-{ref}", daemon=True)
        self._starting.append(thread)
        thread.start()
        return rental

    def _boot(self, rental: Rental) -> None:
        if rental.start_error:
            return  # it fails before any machine exists (a twin made it so at launch)
        try:
            machine = start_machine(self.root, f"{self.provider}-{rental.ref}", gpus=rental.offer.gpus,
                                    driver=rental.offer.driver, cuda=rental.offer.cuda, user=self.login_user,
                                    python=self.python_for(rental), env=self.machine_env(rental))
        except Exception as exc:  # noqa: BLE001 - reported through the API (and the test's view of it)
            rental.start_error = f"{type(exc).__name__}: {exc}"
            return
        with self.lock:
            machine.authorize(rental.keys)
            rental.machine = machine
            gone = rental.deleted or rental.killed
        if gone:
            machine.remove() if rental.deleted else machine.kill()
            return
        self.on_started(rental)

    def restart(self, ref: str) -> None:
        """The host restarts the machine (maintenance, a stop and start): every process on it dies,
        its disk stays, and its sshd comes back on another port, as a Docker host maps a fresh one.
        The API reports it booting again for ``boot_delay_s``."""
        with self.lock:
            rental = self.rentals[str(ref)]
        self._wait_started(rental)
        machine = rental.machine
        if machine is None:
            raise RuntimeError(f"machine {ref} never started")
        machine.kill()
        old = machine.sshd
        config = old.dir / "sshd_config"
        for _ in range(3):
            port = _free_port(old.host)
            if port != old.port:
                break
        config.write_text(re.sub(r"(?m)^Port \d+$", f"Port {port}", config.read_text()))
        old.log.write_text("")
        proc = subprocess.Popen([SSHD, "-D", "-f", str(config), "-E", str(old.log)], stdin=subprocess.DEVNULL)
        with self.lock:
            machine.sshd = dataclasses.replace(old, port=port, proc=proc)
            rental.created = self.clock()  # booting again
            rental.restarts += 1
        # until sshd listens or ends; the test's own timeout bounds it (no deadline read from the clock)
        while proc.poll() is None and "Server listening" not in old.log.read_text():
            time.sleep(0.02)

    def python_for(self, rental: Rental) -> str:
        """The interpreter the rental's machine has: its image's, else its offer's."""
        return self.images.get(str(rental.extra.get("image") or ""), rental.offer.python)

    def _wait_started(self, rental: Rental) -> None:
        for thread in self._starting:
            if thread.name == f"boot-{rental.ref}":
                thread.join(30)

    def authorize(self, rental: Rental, keys: Iterable[str]) -> None:
        """Add login keys to a rental (now, or when its machine has started)."""
        with self.lock:
            for key in keys:
                if key.strip() and key.strip() not in rental.keys:
                    rental.keys.append(key.strip())
            if rental.machine is not None:
                rental.machine.authorize(rental.keys)

    def listed(self) -> list[Rental]:
        """The rentals a listing shows: not deleted, and launched at least ``listing_lag_s`` ago."""
        with self.lock:
            return [r for r in self.rentals.values()
                    if not r.deleted and self.clock() - r.created >= self.listing_lag_s]

    def phase(self, rental: Rental) -> str:
        """deleted | killed | failed | booting (within the boot delay) | starting (booted, sshd not
        yet listening) | up."""
        if rental.deleted:
            return "deleted"
        if rental.killed:
            return "killed"
        if rental.start_error:
            return "failed"
        if self.clock() - rental.created < self.boot_delay_s:
            return "booting"
        if rental.machine is not None and rental.machine.alive():
            if rental.running_at is None:
                rental.running_at = self.wall()  # what a bill counts running time from
            return "up"
        return "starting"

    def delete(self, rental: Rental) -> bool:
        """Delete a rental; False (and nothing done) when ``fail_first_delete`` makes this one fail."""
        with self.lock:
            rental.deletes += 1
            chosen = self.fail_first_delete is True or (
                isinstance(self.fail_first_delete, set) and rental.ref in self.fail_first_delete)
            if chosen and rental.deletes == 1:
                return False
            if rental.deleted:
                return True
            rental.deleted = True
            rental.deleted_at = self.wall()
            if not rental.killed:
                rental.offer.stock += 1  # the GPU goes back on the market
                self.on_stock(rental.offer)
            # a machine still booting is removed by its boot thread when it comes up
            machine = rental.machine
        if machine is not None:
            machine.remove()
        self.on_remove(rental)
        return True

    # hooks for subclasses
    def on_stock(self, offer: TwinOffer) -> None:
        pass

    def on_started(self, rental: Rental) -> None:
        pass

    def on_kill(self, rental: Rental) -> None:
        pass

    def on_remove(self, rental: Rental) -> None:
        pass

    # -- the provider's answers (subclasses) ---------------------------------------------------

    def route(self, method: str, path: str, content: bytes) -> tuple[str, dict[str, str]] | None:
        return schemas.match(self.provider, method, path)

    def handle(self, op_id: str, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        raise NotImplementedError

    def unauthorized(self, op_id: str | None) -> Reply:
        raise NotImplementedError

    def invalid(self, op_id: str, errors: list[str]) -> Reply:
        raise NotImplementedError

    def forbidden(self, op_id: str | None) -> Reply:
        """A key that may not do this (a machine's own key on another machine)."""
        return self.unauthorized(op_id)

    def rate_limited(self, op_id: str | None, wait_s: float) -> Reply:
        raise NotImplementedError

    def not_found(self, path: str) -> Reply:
        return Reply(404, {"error": f"no such path {path}"}, undocumented=True)

    def rate_headers(self) -> dict[str, str]:
        """Headers every answer carries while a rate limit is on (RunPod's documented ones)."""
        return {}

    # -- serving -------------------------------------------------------------------------------

    def _take_token(self) -> float:
        """0 when the request may pass (one token taken), else seconds until the next token."""
        if not self.rate:
            return 0.0
        with self.lock:
            now = self.clock()
            self._tokens = min(float(self.rate), self._tokens + (now - self._refilled) * self.rate)
            self._refilled = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return 0.0
            return (1.0 - self._tokens) / self.rate

    def _serve(self, http: BaseHTTPRequestHandler) -> None:
        url = urlsplit(http.path)
        length = int(http.headers.get("Content-Length") or 0)
        content = http.rfile.read(length) if length else b""
        query_items = parse_qsl(url.query, keep_blank_values=True)
        entry: dict[str, Any] = {"method": http.command, "path": url.path, "query": query_items, "op": None}
        try:
            reply = self._answer(http, url.path, query_items, content, entry)
        except Exception as exc:  # noqa: BLE001 - a twin bug must reach the test, not hang the client
            self.bugs.append(f"{http.command} {url.path}: {type(exc).__name__}: {exc}")
            reply = Reply(500, {"twin_bug": str(exc)}, undocumented=True)
        data = b"" if reply.body is None else json.dumps(reply.body).encode()
        headers = {**self.rate_headers(), **reply.headers}
        entry.update(status=reply.status, headers=dict(headers), body=reply.body)
        with self.lock:
            self.requests.append(entry)
            lose = entry["op"] in self.launch_ops and reply.status < 300 and self.lose_answers > 0
            if lose:
                self.lose_answers -= 1
            gateway = entry["op"] in self.launch_ops and reply.status < 300 and not lose and self.gateway_errors > 0
            if gateway:
                self.gateway_errors -= 1
        if lose:  # done, but the answer never reaches the caller
            entry["lost"] = True
            http.close_connection = True
            return
        if gateway:  # done, but what reaches the caller is the gateway's error page
            code = self.gateway_status
            entry.update(lost=True, status=code)
            reply, data, headers = Reply(code), f"<html><body>{code} Server Error</body></html>".encode(), {
                "Content-Type": "text/html"}
        http.send_response(reply.status)
        if data:
            headers.setdefault("Content-Type", "application/json")
        for name, value in headers.items():
            http.send_header(name, value)
        http.send_header("Content-Length", str(len(data)))
        http.end_headers()
        if data:
            http.wfile.write(data)

    def _answer(self, http: BaseHTTPRequestHandler, path: str, query_items: list[tuple[str, str]], content: bytes,
                entry: dict[str, Any]) -> Reply:
        found = self.route(http.command, path, content)
        op_id = found[0] if found else None
        entry["op"] = op_id
        wait = self._take_token()
        if wait:
            return self._checked(op_id, self.rate_limited(op_id, wait))
        given = http.headers.get("Authorization") or ""
        scoped = self.machine_keys.get(given.removeprefix("Bearer ")) if given.startswith("Bearer ") else None
        if given != f"Bearer {self.api_key}" and scoped is None:
            return self._checked(op_id, self.unauthorized(op_id))
        if found is None:
            return self.not_found(path)
        op_id, params = found
        if scoped is not None and (op_id not in self.machine_key_ops or params.get("id") != scoped):
            entry["scoped_refused"] = True  # a machine's own key, used beyond its own machine
            return self._checked(op_id, self.forbidden(op_id))
        entry["machine_key"] = scoped is not None  # the call came with a machine's own key, not the account's
        errors = schemas.request_errors(self.provider, op_id, query_items, content)
        if errors:
            with self.lock:
                self.violations.append(f"{http.command} {path} ({op_id}): " + "; ".join(errors))
            return self._checked(op_id, self.invalid(op_id, errors))
        body = json.loads(content) if content.strip() else None
        request = schemas.operations(self.provider)[op_id].get("request") or {"query": {}}
        query = schemas.typed_query(query_items, request["query"])
        try:
            reply = self.handle(op_id, params, query, body)
        except Refused as refused:
            reply = refused.reply
        return self._checked(op_id, reply)

    def _checked(self, op_id: str | None, reply: Reply) -> Reply:
        """``reply`` once its body matches the published schema; a mismatch is a twin bug."""
        schema = schemas.response_schema(self.provider, op_id, reply.status) if op_id else None
        if schema is None:
            if not reply.undocumented and op_id is not None:
                raise AssertionError(f"{op_id} has no documented HTTP {reply.status} answer")
            schema = self.error_schema
        if reply.body is None:
            if schema not in (False, {}) and not reply.undocumented:
                raise AssertionError(f"{op_id} HTTP {reply.status} needs a body")
        else:
            errors = schemas.response_errors(schema, reply.body)
            if errors:
                raise AssertionError(f"{op_id} HTTP {reply.status} breaks its schema: {errors}")
        return reply


def ceil_seconds(wait: float) -> int:
    return max(1, math.ceil(wait))


def public_keys(text: str | None) -> list[str]:
    """The OpenSSH public keys in ``text`` (one a line)."""
    return [line.strip() for line in (text or "").splitlines() if re.match(r"\s*(ssh-|ecdsa-|sk-)", line)]

