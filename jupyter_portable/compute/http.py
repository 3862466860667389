"""The one HTTP client the cloud providers share, and where httpx errors are translated.

Every provider module talks to its API through :class:`ApiClient`. It adds the bearer
key to each request (never to the URL), retries (with tenacity, see :class:`RetryPolicy`),
parses JSON, and turns whatever goes wrong into :mod:`jupyter_portable.core.errors`::

    httpx.TimeoutException, httpx.TransportError  -> ProviderUnavailable (retried first)
    body that is not JSON, or not the shape read  -> ProviderUnavailable
    429, whatever its body says                   -> ProviderUnavailable with the wait in its hint
                                                     (a rate limit, never "launch failed")
    any other HTTP error status                   -> the provider's classifier (its codes and
                                                     texts: NoCapacity, QuotaExceeded, ...), else
        401 / 403                                 -> AuthError
        5xx                                       -> ProviderUnavailable
        any other                                 -> LaunchFailed for a launch, else ProviderUnavailable

Retries: 429, 5xx, timeouts and connection errors are tried again with jittered exponential
backoff, waiting at least what ``Retry-After`` (seconds or an HTTP date) or the rate-limit
reset headers ask, bounded. A launch is tried again only when the provider cannot have acted
on it (429, or no connection made): it may rent something. A terminate keeps trying until
the provider confirms, within a longer time budget; then its error says the machine may
still be running and names it (``context["may_be_running"]``).

The key lives in a :class:`Secret` and is scrubbed from every message built here, so
a provider that echoes it back still cannot put it in an exception or a log line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import tenacity

from jupyter_portable.compute.base import (  # noqa: F401 (re-exported)
    LOOKUP_BUDGET_S,
    Allocation,
    MachineInfo,
    Provider,
    look_up_until_known,
    spend_since,
)
from jupyter_portable.core.errors import AuthError, ComputeError, LaunchFailed, ProviderUnavailable, UsageError
from jupyter_portable.core.offers import Offer

# Tried again on these: the provider refused for now (429) or failed (5xx).
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
# the longest wait a provider's Retry-After or reset header can impose on one retry
MAX_RETRY_AFTER = 120.0
MAX_DETAIL = 300
# Rate-limit headers that say when to come back, besides Retry-After: delta seconds, or a
# Unix time when large (GitHub-style X-RateLimit-Reset).
RESET_HEADERS = ("RateLimit-Reset", "X-RateLimit-Reset")
UNIX_TIME = 1e9


@dataclass(frozen=True)
class RetryPolicy:
    """How long one call keeps trying: at most ``attempts`` tries within ``budget_s`` seconds
    (waits included), waits growing from ``backoff`` to ``max_backoff`` with jitter."""

    attempts: int = 5
    budget_s: float = 60.0
    backoff: float = 0.5
    max_backoff: float = 30.0
    max_retry_after: float = MAX_RETRY_AFTER
    # a terminate keeps trying much longer: giving up may leave a paid machine running
    terminate_attempts: int = 20
    terminate_budget_s: float = 300.0

    def limits(self, operation: str) -> tuple[int, float]:
        """``(attempts, budget_s)`` for a call named ``operation``."""
        if operation == "terminate":
            return max(self.attempts, self.terminate_attempts), max(self.budget_s, self.terminate_budget_s)
        return max(1, self.attempts), self.budget_s


class _Again(Exception):
    """Internal: one try failed in a way worth another; ``error`` is raised if none is left."""

    def __init__(self, error: ComputeError, asked_wait: float | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.asked_wait = asked_wait


def server_wait(headers: httpx.Headers, *, now: float) -> float | None:
    """Seconds the server asked to wait: ``Retry-After`` (seconds or an HTTP date), else a
    rate-limit reset header; dates are read against the response's ``Date`` (else ``now``)."""
    date = _http_date(headers.get("Date"))
    base = date if date is not None else now
    retry_after = headers.get("Retry-After")
    if retry_after:
        seconds = _seconds(retry_after)
        if seconds is not None:
            return seconds
        when = _http_date(retry_after)
        if when is not None:
            return max(0.0, when - base)
    for name in RESET_HEADERS:
        value = _seconds(headers.get(name))
        if value is not None:
            return max(0.0, value - base) if value >= UNIX_TIME else value
    return None


def _http_date(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


class Secret:
    """A credential that never prints: ``repr`` and ``str`` show only whether it is set."""

    __slots__ = ("_value",)

    def __init__(self, value: str | None) -> None:
        self._value = value or None

    def reveal(self) -> str | None:
        return self._value

    def __bool__(self) -> bool:
        return self._value is not None

    def __repr__(self) -> str:
        return "Secret(set)" if self._value else "Secret(unset)"

    __str__ = __repr__


def key_from(explicit: str | None, env_var: str) -> Secret:
    """The constructor argument if given, else the environment variable (read once)."""
    return Secret(explicit if explicit is not None else os.environ.get(env_var))


class ShapeError(ValueError):
    """A response did not have the field or type the code reads."""


def need(obj: Any, key: str, kind: type | tuple[type, ...], *, where: str = "") -> Any:
    """``obj[key]``, which must exist and be a ``kind``; ShapeError otherwise."""
    if not isinstance(obj, dict):
        raise ShapeError(f"{where or 'body'} is {type(obj).__name__}, not an object")
    if key not in obj:
        raise ShapeError(f"missing field {where + '.' if where else ''}{key}")
    return _typed(obj[key], key, kind, where)


def opt(obj: Any, key: str, kind: type | tuple[type, ...], *, where: str = "") -> Any:
    """``obj[key]`` if present and not null (then it must be a ``kind``), else None."""
    if not isinstance(obj, dict):
        raise ShapeError(f"{where or 'body'} is {type(obj).__name__}, not an object")
    value = obj.get(key)
    return None if value is None else _typed(value, key, kind, where)


def _typed(value: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python, never in JSON
    if isinstance(value, bool) and bool not in kinds:
        ok = False
    else:
        ok = isinstance(value, kinds)
    if not ok:
        names = "/".join(k.__name__ for k in kinds)
        raise ShapeError(f"field {where + '.' if where else ''}{key} is {type(value).__name__}, not {names}")
    return value


NUMBER = (int, float)

Classifier = Callable[["ErrorInfo"], "ComputeError | None"]


class ErrorInfo:
    """What a classifier sees of a failed response: status, parsed body (or None), scrubbed text."""

    def __init__(self, *, provider: str, operation: str, method: str, path: str, status: int,
                 body: Any, text: str, retry_after: str | None) -> None:
        self.provider = provider
        self.operation = operation
        self.method = method
        self.path = path
        self.status = status
        self.body = body
        self.text = text
        self.retry_after = retry_after

    @property
    def where(self) -> str:
        return f"{self.method} {self.path}"


class ApiClient:
    """A sync httpx client bound to one provider's API and key.

    ``classify`` maps a provider's own error bodies (codes, messages) to typed errors;
    it returns None to fall back to the mapping by status in the module docstring.
    """

    def __init__(self, *, provider: str, base_url: str, key: Secret, key_env: str, key_hint: str,
                 classify: Classifier | None = None, timeout: float = 30.0, retries: int = 4,
                 backoff: float = 0.5, policy: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, transport: httpx.BaseTransport | None = None) -> None:
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self._key = key
        self.key_env = key_env
        self.key_hint = key_hint
        self.classify = classify
        self.timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))
        self.policy = policy or RetryPolicy(attempts=1 + max(0, retries), backoff=max(0.0, backoff))
        self.retries = self.policy.attempts - 1
        self.backoff = self.policy.backoff
        # backoff * 2**(n-1), capped, plus up to one backoff of jitter so that clients spread out
        self._backoff = (tenacity.wait_exponential(multiplier=self.backoff, max=self.policy.max_backoff)
                         + tenacity.wait_random(0, self.backoff))
        # passed in so that tests neither sleep nor read the clock: waits are recorded instead
        self.sleep = sleep
        self.clock = clock
        self.wall = wall
        self._transport = transport
        self._client: httpx.Client | None = None
        self.log = logging.getLogger(f"jupyter_portable.compute.{provider}")

    def __repr__(self) -> str:
        return f"ApiClient({self.provider!r}, {self.base_url!r}, key={self._key!r})"

    # -- plumbing -------------------------------------------------------------------------

    def _http(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(base_url=self.base_url, timeout=self.timeout, transport=self._transport,
                                        headers={"Accept": "application/json",
                                                 "User-Agent": "jupyter-portable"})
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def scrub(self, text: str, extra: Iterable[str] = ()) -> str:
        """``text`` without the key (or any of ``extra``), cut to a readable length."""
        for secret in (self._key.reveal(), *extra):
            if secret and len(secret) >= 4:
                text = text.replace(secret, "***")
        text = " ".join(text.split())
        return text if len(text) <= MAX_DETAIL else text[:MAX_DETAIL] + "..."

    def _auth_header(self) -> dict[str, str]:
        key = self._key.reveal()
        if not key:
            raise AuthError(f"no {self.provider} API key: {self.key_env} is not set",
                            provider=self.provider, hint=f"export {self.key_env}=... ({self.key_hint}), "
                            "or pass api_key= to the provider")
        return {"Authorization": f"Bearer {key}"}

    def _fail(self, cls: type[ComputeError], message: str, *, hint: str | None = None,
              secrets: Iterable[str] = (), **context: Any) -> ComputeError:
        return cls(self.scrub(message, secrets), provider=self.provider, hint=hint, **context)

    # -- the one entry point ------------------------------------------------------------

    def request(self, method: str, path: str, *, operation: str, json_body: Any = None,
                params: dict[str, Any] | None = None, ok: Iterable[int] = (200,),
                secrets: Iterable[str] = (), allow: Iterable[int] = (),
                confirm: Callable[[Any], str | None] | None = None) -> tuple[int, Any]:
        """Send one request, retried as the module docstring says; return ``(status, parsed JSON
        or None)`` for a status in ``ok`` or ``allow``. Anything else raises a typed error, with
        ``context["attempts"]``. ``secrets`` are scrubbed from messages too (a launch's env
        values). ``operation`` names the call ("launch", "terminate", ...). ``confirm`` reads an
        ``ok`` body and returns why the provider did not do it (tried again), or None."""
        headers = self._auth_header()
        secrets = tuple(s for s in secrets if s)
        ok_set, allow_set = frozenset(ok), frozenset(allow)
        attempts, budget = self.policy.limits(operation)
        started = self.clock()
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Again),
            wait=self._wait,
            stop=lambda rs: rs.attempt_number >= attempts or self.clock() - started + rs.upcoming_sleep > budget,
            sleep=self.sleep, before_sleep=self._log_retry, reraise=True)
        try:
            return retrying(self._once, method.upper(), path, operation=operation, json_body=json_body,
                            params=params, headers=headers, ok=ok_set, allow=allow_set, secrets=secrets,
                            confirm=confirm)
        except _Again as again:
            error = again.error
            tries = retrying.statistics.get("attempt_number", 1)
            error.context["attempts"] = tries
            if tries > 1:
                error.args = (f"{error} (tried {tries} times over {self.clock() - started:.0f}s)",)
            raise error from again.__cause__
        except ComputeError as error:
            error.context.setdefault("attempts", retrying.statistics.get("attempt_number", 1))
            raise

    def _once(self, method: str, path: str, *, operation: str, json_body: Any, params: dict[str, Any] | None,
              headers: dict[str, str], ok: frozenset[int], allow: frozenset[int], secrets: tuple[str, ...],
              confirm: Callable[[Any], str | None] | None) -> tuple[int, Any]:
        """One try: the answer, a typed error, or :class:`_Again` when another try is worth it."""
        where = f"{method} {path}"
        # a launch may rent something: tried again only when the provider cannot have acted on it
        unsafe = operation == "launch" and method != "GET"
        try:
            response = self._http().request(method, path, json=json_body, params=params, headers=headers)
        except httpx.TimeoutException as exc:
            error = self._fail(ProviderUnavailable, f"{self.provider} did not answer {where} in time "
                               f"({type(exc).__name__})", hint=self._unsure_hint(method, operation),
                               secrets=secrets)
            if unsafe and not isinstance(exc, httpx.ConnectTimeout):
                raise error from exc
            raise _Again(error, None) from exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            error = self._fail(ProviderUnavailable, f"could not reach {self.provider} for {where}: "
                               f"{type(exc).__name__}: {exc}", hint=self._unsure_hint(method, operation),
                               secrets=secrets)
            if isinstance(exc, httpx.TransportError) and (not unsafe or isinstance(exc, httpx.ConnectError)):
                raise _Again(error, None) from exc
            raise error from exc
        status = response.status_code
        self.log.debug("%s %s -> %s", method, path, status)
        if status in RETRY_STATUS and not (unsafe and status != 429):
            body = self._parse(response, where, secrets, expect_json=False)
            raise _Again(self._map_error(method, path, operation, response, body, secrets),
                         server_wait(response.headers, now=self.wall()))
        body = self._parse(response, where, secrets, expect_json=status in ok and status != 204)
        if status in ok and confirm is not None:
            refused = confirm(body)
            if refused:
                raise _Again(self._fail(ProviderUnavailable, refused, secrets=secrets, status=status), None)
        if status in ok or status in allow:
            return status, body
        raise self._map_error(method, path, operation, response, body, secrets)

    def _wait(self, retry_state: tenacity.RetryCallState) -> float:
        """Jittered exponential backoff, but at least what the server asked (bounded)."""
        policy = self.policy
        wait = self._backoff(retry_state)
        outcome = retry_state.outcome
        failure = outcome.exception() if outcome is not None else None
        if isinstance(failure, _Again) and failure.asked_wait is not None:
            wait = max(wait, min(failure.asked_wait, policy.max_retry_after))
        return float(wait)

    def _log_retry(self, retry_state: tenacity.RetryCallState) -> None:
        outcome = retry_state.outcome
        failure = outcome.exception() if outcome is not None else None
        self.log.info("%s: try %d failed (%s); trying again in %.1fs", self.provider, retry_state.attempt_number,
                      failure, retry_state.upcoming_sleep)

    def _unsure_hint(self, method: str, operation: str) -> str:
        if method.upper() != "GET" and operation in ("launch", "terminate"):
            # the request may have been applied before the connection dropped
            return (f"the {operation} may have gone through; check the {self.provider} console "
                    "before retrying, so nothing is rented twice")
        return f"check your network, or {self.provider}'s status page, and try again"

    def _parse(self, response: httpx.Response, where: str, secrets: tuple[str, ...], *, expect_json: bool) -> Any:
        content = response.content
        if not content.strip():
            if expect_json:
                raise self._fail(ProviderUnavailable, f"{self.provider} answered {where} with an empty body "
                                 f"(HTTP {response.status_code})", secrets=secrets)
            return None
        try:
            return json.loads(content)
        except ValueError as exc:
            if not expect_json:
                return None  # an error page; mapped by status below
            raise self._fail(ProviderUnavailable, f"{self.provider} answered {where} with a body that is not "
                             f"JSON (HTTP {response.status_code}): {response.text[:80]!r}",
                             secrets=secrets) from exc

    def _map_error(self, method: str, path: str, operation: str, response: httpx.Response, body: Any,
                   secrets: tuple[str, ...]) -> ComputeError:
        status = response.status_code
        text = self.scrub(response.text, secrets)
        info = ErrorInfo(provider=self.provider, operation=operation, method=method, path=path, status=status,
                         body=body, text=text, retry_after=response.headers.get("Retry-After"))
        # A rate limit is a rate limit whatever code its body carries: the request was not
        # looked at, so it is never "launch failed" and the route stays worth another try.
        if self.classify is not None and status != 429:
            mapped = self.classify(info)
            if mapped is not None:
                # classifiers build messages from the body: scrub them as well
                mapped.args = (self.scrub(str(mapped), secrets),)
                if mapped.hint:
                    mapped.hint = self.scrub(mapped.hint, secrets)
                return mapped
        return self.default_error(info, secrets)

    def default_error(self, info: ErrorInfo, secrets: Iterable[str] = ()) -> ComputeError:
        """The mapping by status alone (see the module docstring)."""
        what = f"{self.provider} refused {info.where} (HTTP {info.status})"
        detail = f": {info.text}" if info.text else ""
        if info.status in (401, 403):
            return self._fail(AuthError, what + detail, secrets=secrets, status=info.status,
                              hint=f"check {self.key_env}: the key is wrong, expired, or lacks this permission")
        if info.status == 429:
            wait = _seconds(info.retry_after)
            shown = f" (Retry-After: {info.retry_after}s)" if info.retry_after else ""
            return self._fail(ProviderUnavailable, f"{self.provider} rate-limited {info.where}{shown}"
                              + detail, secrets=secrets, status=info.status, rate_limited=True, retry_after=wait,
                              hint=f"wait {wait:g}s and try again" if wait is not None
                              else "wait a little and try again")
        if info.status >= 500:
            return self._fail(ProviderUnavailable, f"{self.provider} failed {info.where} (HTTP {info.status})"
                              + detail, secrets=secrets, status=info.status,
                              hint=self._unsure_hint(info.method, info.operation))
        cls: type[ComputeError] = LaunchFailed if info.operation == "launch" else ProviderUnavailable
        return self._fail(cls, what + detail, secrets=secrets, status=info.status)

    @contextmanager
    def reading(self, what: str) -> Iterator[None]:
        """Turn a shape surprise while reading a response into ProviderUnavailable."""
        try:
            yield
        except (ValueError, KeyError, IndexError, TypeError) as exc:  # ShapeError is a ValueError
            detail = str(exc) if isinstance(exc, ShapeError) else f"{type(exc).__name__}: {exc}"
            raise self._fail(ProviderUnavailable, f"{self.provider} answered {what} with an unexpected shape: "
                             f"{detail}", hint="the provider's API may have changed; report it with this message") \
                from exc


def _seconds(retry_after: str | None) -> float | None:
    """``Retry-After`` in seconds when it is a number (an HTTP date is left to the caller's backoff)."""
    try:
        return max(0.0, float(retry_after)) if retry_after else None
    except ValueError:
        return None


class HttpProvider(Provider):
    """What the cloud providers share: one :class:`ApiClient`, a repr without the key, close()."""

    _api: ApiClient
    # the least time between two status polls of one machine (see acquire's polling): the
    # providers rate-limit per key, Lambda documents one request per second
    min_poll_interval_s: float = 1.0
    # how long a launch whose answer was lost is looked for by its name (base.LOOKUP_BUDGET_S)
    lookup_budget_s: float = LOOKUP_BUDGET_S

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self._api.base_url!r}, key={self._api._key!r})"

    def close(self) -> None:
        """Close the HTTP connection pool (the provider stays usable; it reopens on demand)."""
        self._api.close()

    def __enter__(self) -> HttpProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _releasing(self, allocation: Allocation, noun: str) -> Iterator[None]:
        """A terminate that was not confirmed says the machine may still be running and names it
        (``context``: ``may_be_running``, ``machine``, ``allocation_id``): never a silent success."""
        try:
            yield
        except ComputeError as exc:
            tries = exc.context.get("attempts")
            after = f" after {tries} attempts" if isinstance(tries, int) and tries > 1 else ""
            exc.args = (f"{self.name} {noun} {allocation.ref} (allocation {allocation.allocation_id}) may still "
                        f"be running: terminating it was not confirmed{after}: {exc}",)
            exc.context.update(may_be_running=True, machine=allocation.ref, allocation_id=allocation.allocation_id)
            exc.hint = (f"terminate {noun} {allocation.ref} in the {self.name} console, or try again later"
                        + (f" ({exc.hint})" if exc.hint else ""))
            raise

    def _found_after_lost_answer(self, exc: ComputeError, allocation_id: str) -> MachineInfo | None:
        """After a launch whose answer never came, or came as a 5xx (a timeout, a dropped connection,
        a gateway's error page: the provider may have acted on it), the machine that launch made,
        looked up by its name with backoff until it is known (:func:`~.base.look_up_until_known`:
        a listing may lag the launch), else None once it is confirmed absent. A rate limit, or any
        other answer, was never acted on."""
        status = exc.context.get("status")
        if not isinstance(exc, ProviderUnavailable) or exc.context.get("rate_limited") \
                or (status is not None and not (isinstance(status, int) and status >= 500)):
            return None
        try:
            machine = look_up_until_known(lambda: self.find_machines(allocation_id=allocation_id),
                                          budget_s=self.lookup_budget_s, clock=self._api.clock,
                                          sleep=self._api.sleep)
            found = [machine] if machine is not None else []
        except ComputeError as again:
            exc.args = (f"{exc}; looking the launch up by its name failed too ({again}): machine "
                        f"{allocation_id} may be running",)
            exc.context.update(may_be_running=True, allocation_id=allocation_id)
            raise exc from again
        self._api.log.info("%s: the launch's answer was lost; found %s by its name", self.name,
                           [m.ref for m in found])
        return found[0] if found else None

    @contextmanager
    def _for_offer(self, offer_id: str) -> Iterator[None]:
        """Errors raised inside name the offer they concern."""
        try:
            yield
        except ComputeError as exc:
            if exc.offer is None:
                exc.offer = offer_id
            raise


def make_offer(provider: str, **fields: Any) -> Offer | None:
    """An Offer from provider data, or None (with a warning) when the listing is not a valid
    offer: one odd row should not hide the rest of a provider's catalog."""
    try:
        return Offer(provider=provider, **fields)
    except UsageError as exc:
        logging.getLogger(f"jupyter_portable.compute.{provider}").warning("skipping a listing: %s", exc)
        return None


ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")


def check_env_names(env: dict[str, str], provider: str) -> None:
    """Refuse names a shell or Docker cannot take, before anything is rented."""
    bad = [k for k in env if not ENV_NAME.match(k)]
    if bad:
        raise LaunchFailed(f"environment variable name(s) not usable: {', '.join(map(repr, bad))}", provider=provider,
                           hint="use letters, digits and underscores, not starting with a digit")


def slug(text: str) -> str:
    """A provider name made safe for an offer id ("NVIDIA GeForce RTX 4090" -> "NVIDIA-GeForce-RTX-4090")."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def matches(pattern: re.Pattern[str], *texts: object) -> bool:
    """Whether any of ``texts`` (strings; others ignored) matches ``pattern``."""
    return any(isinstance(t, str) and pattern.search(t) for t in texts)

