"""Retries and polling of the HTTP providers (issue 13, item 3), at their real URLs (respx).

No test sleeps: each provider gets a fake clock whose ``sleep`` records the wait tenacity
chose and moves the clock on, so the waits (backoff, ``Retry-After``) and the time budgets
are asserted on as numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
import respx
from test_provider_http import (
    KEY,
    LAMBDA,
    RUNPOD,
    VAST,
    allocation,
    body,
    check_request,
    reply,
    spot_offer,
)

from jupyter_portable.compute.acquire import acquire, poll_intervals
from jupyter_portable.compute.http import RetryPolicy, server_wait
from jupyter_portable.compute.lambdalabs import LambdaProvider
from jupyter_portable.compute.runpod import RunPodProvider
from jupyter_portable.compute.vastai import VastProvider
from jupyter_portable.core.errors import AuthError, ComputeError, NoCapacity, ProviderUnavailable
from jupyter_portable.core.offers import Requirements


@pytest.fixture(name="api")
def _api() -> Iterator[respx.MockRouter]:
    """The providers' APIs at their real URLs; every request sent is then checked against its
    published request schema (as in test_provider_http.py)."""
    with respx.mock(assert_all_called=False) as mock:
        yield mock
    for call in mock.calls:
        check_request(call.request)


class FakeClock:
    """A monotonic clock that only ``sleep`` moves; ``waits`` lists every sleep asked for."""

    def __init__(self) -> None:
        self.now = 5000.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def make(provider: str, clock: FakeClock, **kw: Any) -> Any:
    cls = {"runpod": RunPodProvider, "vastai": VastProvider, "lambda": LambdaProvider}[provider]
    if provider == "lambda":
        kw.setdefault("ssh_key_names", ["jp-worker"])
    return cls(api_key=KEY, sleep=clock.sleep, clock=clock, **kw)


TERMINATE = {"runpod": ("DELETE", f"{RUNPOD}/v2/pods/7h9k2m4n6p", httpx.Response(204)),
             "vastai": ("DELETE", f"{VAST}/api/v0/instances/7654321/", reply("vastai", "destroyInstance.200.json")),
             "lambda": ("POST", f"{LAMBDA}/api/v1/instance-operations/terminate",
                        reply("lambda", "terminateInstance.200.json"))}
REF = {"runpod": "7h9k2m4n6p", "vastai": "7654321", "lambda": "0920582c7ff041399e34823a0be62549"}


def terminate_route(api: respx.MockRouter, provider: str) -> tuple[respx.Route, httpx.Response]:
    method, url, done = TERMINATE[provider]
    return api.route(method=method, url=url), done


# -- terminates keep trying until the provider confirms -------------------------------------------


def test_a_rate_limited_vast_delete_is_tried_again_and_succeeds(api: respx.MockRouter) -> None:
    route, done = terminate_route(api, "vastai")
    route.mock(side_effect=[httpx.Response(429, json={"success": False, "error": "rate_limited"}), done])
    clock = FakeClock()
    make("vastai", clock).terminate(allocation("vastai", REF["vastai"]))
    assert route.call_count == 2
    assert len(clock.waits) == 1 and 0 < clock.waits[0] <= 1.0  # backoff 0.5 s plus up to 0.5 s of jitter


def test_a_lambda_terminate_that_gets_503_three_times_then_200_succeeds_with_growing_waits(
        api: respx.MockRouter) -> None:
    route, done = terminate_route(api, "lambda")
    busy = httpx.Response(503, json={"error": {"code": "global/unknown", "message": "try again"}})
    route.mock(side_effect=[busy, busy, busy, done])
    clock = FakeClock()
    make("lambda", clock).terminate(allocation("lambda", REF["lambda"]))
    assert route.call_count == 4
    # jittered exponential: 0.5 * 2**n plus up to 0.5
    for n, wait in enumerate(clock.waits):
        assert 0.5 * 2 ** n <= wait <= 0.5 * 2 ** n + 0.5
    assert clock.waits == sorted(clock.waits)


def test_a_vast_delete_answered_success_false_is_tried_until_vast_confirms(api: respx.MockRouter) -> None:
    route, done = terminate_route(api, "vastai")
    route.mock(side_effect=[httpx.Response(200, json={"success": False, "msg": "busy"}), done])
    clock = FakeClock()
    make("vastai", clock).terminate(allocation("vastai", REF["vastai"]))
    assert route.call_count == 2


FAILURES = [
    pytest.param("runpod", httpx.Response(503, json={"title": "Service Unavailable", "status": 503}), id="runpod-503"),
    pytest.param("vastai", httpx.Response(429, json={"success": False, "error": "rate_limited"}), id="vastai-429"),
    pytest.param("vastai", httpx.Response(200, json={"success": False, "msg": "busy"}), id="vastai-unconfirmed"),
    pytest.param("lambda", httpx.ReadTimeout("timed out"), id="lambda-timeout"),
    pytest.param("lambda", httpx.ConnectError("refused"), id="lambda-connect"),
]


@pytest.mark.parametrize("provider,failure", FAILURES)
def test_a_terminate_that_never_succeeds_says_the_machine_may_still_be_running_and_names_it(
        api: respx.MockRouter, provider: str, failure: Any) -> None:
    route, _ = terminate_route(api, provider)
    if isinstance(failure, Exception):
        route.mock(side_effect=failure)
    else:
        route.mock(return_value=failure)
    clock = FakeClock()
    subject = make(provider, clock)
    alloc = allocation(provider, REF[provider])
    with pytest.raises(ProviderUnavailable) as info:
        subject.terminate(alloc)
    exc = info.value
    policy: RetryPolicy = subject._api.policy
    assert 1 < route.call_count <= policy.terminate_attempts  # kept trying, and stopped
    assert exc.context["attempts"] == route.call_count
    assert sum(clock.waits) <= policy.terminate_budget_s  # the whole wait stayed in the budget
    assert "may still be running" in str(exc) and REF[provider] in str(exc) and alloc.allocation_id in str(exc)
    assert exc.context["may_be_running"] is True
    assert (exc.context["machine"], exc.context["allocation_id"]) == (alloc.ref, alloc.allocation_id)
    assert REF[provider] in (exc.hint or "")
    assert KEY not in exc.one_line()


def test_a_terminate_refused_outright_is_not_retried_and_still_never_a_silent_success(
        api: respx.MockRouter) -> None:
    route, _ = terminate_route(api, "runpod")
    route.mock(return_value=httpx.Response(401, json={"title": "Unauthorized", "status": 401}))
    clock = FakeClock()
    with pytest.raises(AuthError) as info:
        make("runpod", clock).terminate(allocation("runpod", REF["runpod"]))
    assert route.call_count == 1 and clock.waits == []
    assert "may still be running" in str(info.value) and info.value.context["machine"] == REF["runpod"]


# -- what the server asks is honoured, bounded ------------------------------------------------------


POD = f"{RUNPOD}/v2/pods/7h9k2m4n6p"


def limited(**headers: str) -> httpx.Response:
    return httpx.Response(429, json={"title": "Too Many Requests", "status": 429}, headers=headers)


def test_retry_after_seconds_makes_the_wait_at_least_that_long(api: respx.MockRouter) -> None:
    route = api.get(POD).mock(side_effect=[limited(**{"Retry-After": "7"}),
                                           reply("runpod", "getPod.200.reachable.json")])
    clock = FakeClock()
    assert make("runpod", clock).status(allocation("runpod", "7h9k2m4n6p")).state == "reachable"
    assert route.call_count == 2
    assert clock.waits[0] >= 7 and clock.waits[0] <= 7 + 1  # the backoff alone would be about 0.5 s


def test_retry_after_as_an_http_date_is_read_against_the_response_date(api: respx.MockRouter) -> None:
    sent = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
    headers = {"Date": format_datetime(sent, usegmt=True),
               "Retry-After": format_datetime(sent + timedelta(seconds=9), usegmt=True)}
    route = api.get(POD).mock(side_effect=[limited(**headers), reply("runpod", "getPod.200.reachable.json")])
    clock = FakeClock()
    make("runpod", clock).status(allocation("runpod", "7h9k2m4n6p"))
    assert route.call_count == 2 and clock.waits == [pytest.approx(9.0)]


@pytest.mark.parametrize("header,value,seconds", [
    ("RateLimit-Reset", "4", 4.0),
    ("X-RateLimit-Reset", "6", 6.0),
    ("X-RateLimit-Reset", str(int(datetime(2026, 3, 1, 12, 0, 5, tzinfo=timezone.utc).timestamp())), 5.0),
])
def test_the_rate_limit_reset_headers_are_honoured(header: str, value: str, seconds: float) -> None:
    headers = httpx.Headers({header: value, "Date": "Sun, 01 Mar 2026 12:00:00 GMT"})
    assert server_wait(headers, now=0.0) == pytest.approx(seconds)
    assert server_wait(httpx.Headers({"Retry-After": "soon"}), now=0.0) is None


def test_a_retry_after_past_the_budget_is_not_waited_for_but_reported(api: respx.MockRouter) -> None:
    route = api.get(POD).mock(return_value=limited(**{"Retry-After": "3600"}))
    clock = FakeClock()
    with pytest.raises(ProviderUnavailable) as info:
        make("runpod", clock).status(allocation("runpod", "7h9k2m4n6p"))
    assert route.call_count == 1 and clock.waits == []  # an hour is past a status call's 60 s budget
    assert info.value.context["rate_limited"] is True and info.value.context["retry_after"] == 3600.0
    assert "3600" in (info.value.hint or "")


def test_a_terminate_waits_a_long_retry_after_only_up_to_the_bound(api: respx.MockRouter) -> None:
    route, done = terminate_route(api, "runpod")
    route.mock(side_effect=[limited(**{"Retry-After": "3600"}), done])
    clock = FakeClock()
    subject = make("runpod", clock)
    subject.terminate(allocation("runpod", REF["runpod"]))
    assert route.call_count == 2 and clock.waits == [subject._api.policy.max_retry_after]


# -- what is not retried ---------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 404])
def test_a_client_error_is_not_retried(api: respx.MockRouter, status: int) -> None:
    route = api.get(f"{RUNPOD}/v2/account/ssh-keys").mock(
        return_value=httpx.Response(status, json={"title": "refused", "status": status, "detail": "no"}))
    clock = FakeClock()
    with pytest.raises(ComputeError) as info:
        make("runpod", clock).check_permission(spot_offer())
    assert route.call_count == 1 and clock.waits == []
    assert info.value.context["attempts"] == 1


def test_a_launch_is_tried_again_only_when_no_connection_was_made(api: respx.MockRouter) -> None:
    create = api.post(f"{RUNPOD}/v2/pods").mock(side_effect=[httpx.ConnectError("refused"),
                                                             reply("runpod", "createPod.201.json")])
    clock = FakeClock()
    alloc = make("runpod", clock).launch(spot_offer(spot=False), allocation_id="alloc-0001")
    assert alloc.ref and create.call_count == 2
    create.mock(side_effect=[reply("runpod", "createPod.503.json"), reply("runpod", "createPod.201.json")])
    listed = api.get(f"{RUNPOD}/v2/pods").mock(return_value=httpx.Response(200, json={"pods": []}))
    with pytest.raises(ProviderUnavailable) as info:
        make("runpod", clock).launch(spot_offer(spot=False), allocation_id="alloc-0002")
    assert create.call_count == 2 + 1  # a 503 may have rented something: never sent twice
    assert listed.call_count > 1  # looked up by its name, with backoff, until confirmed absent; none was found
    assert "may have gone through" in (info.value.hint or "")


def test_gets_are_retried_within_their_attempts(api: respx.MockRouter) -> None:
    route = api.get(POD).mock(return_value=reply("runpod", "createPod.503.json"))
    clock = FakeClock()
    subject = make("runpod", clock, retries=3)
    with pytest.raises(ProviderUnavailable) as info:
        subject.status(allocation("runpod", "7h9k2m4n6p"))
    assert route.call_count == 4 == info.value.context["attempts"]
    assert len(clock.waits) == 3 and "tried 4 times" in str(info.value)


# -- polling a booting machine backs off -------------------------------------------------------------


def booting_pod(api: respx.MockRouter) -> tuple[respx.Route, respx.Route]:
    api.get(f"{RUNPOD}/v2/account/ssh-keys").mock(return_value=reply("runpod", "getSshKeys.200.json"))
    api.get(url__regex=rf"{RUNPOD}/v2/catalog/gpus/.+").mock(return_value=reply("runpod", "getGpuType.200.high.json"))
    api.post(f"{RUNPOD}/v2/pods").mock(return_value=reply("runpod", "createPod.201.json"))
    pod = body("runpod", "createPod.201.json")["id"]
    polls = api.get(f"{RUNPOD}/v2/pods/{pod}").mock(return_value=reply("runpod", "getPod.200.provisioning.json"))
    released = api.delete(f"{RUNPOD}/v2/pods/{pod}").mock(return_value=httpx.Response(204))
    api.get(f"{RUNPOD}/v2/billing/pods").mock(return_value=reply("runpod", "listPodBilling.200.json"))
    return polls, released


def test_status_polling_backs_off_stays_under_the_bound_and_releases_on_timeout(api: respx.MockRouter) -> None:
    polls, released = booting_pod(api)
    clock = FakeClock()
    provider = make("runpod", clock)
    with pytest.raises(NoCapacity) as info:
        acquire([spot_offer(spot=False)], {"runpod": provider}, Requirements(), allocation_id_factory=lambda: "al-1",
                boot_timeout_s=120, poll_interval_s=1.0, poll_max_s=10.0, clock=clock, sleep=clock.sleep)
    tried = info.value.context["attempts"]
    assert isinstance(tried, list) and tried[0].error == "Timeout"
    assert released.call_count == 1
    assert (tried[0].spend, tried[0].spend_source) == (0.0734, "bill")  # the machine ran: its bill is kept
    waits = clock.waits
    assert waits[0] == pytest.approx(1.0)
    # never faster again, except the last wait, cut to the deadline
    assert all(b >= a for a, b in zip(waits[:-1], waits[1:-1], strict=False))
    assert waits[-2] == pytest.approx(10.0) and max(waits) <= 10.0  # backed off to the bound, not past it
    assert polls.call_count == len(waits) + 1 < 25  # four a second would have been 480 polls
    assert sum(waits) == pytest.approx(120.0)


def test_status_polling_never_goes_under_the_providers_floor(api: respx.MockRouter) -> None:
    polls, _ = booting_pod(api)
    clock = FakeClock()
    provider = make("runpod", clock)
    with pytest.raises(NoCapacity):
        acquire([spot_offer(spot=False)], {"runpod": provider}, Requirements(), allocation_id_factory=lambda: "al-1",
                boot_timeout_s=10, poll_interval_s=0.05, poll_max_s=0.05, clock=clock, sleep=clock.sleep)
    assert clock.waits and min(clock.waits) >= provider.min_poll_interval_s == 1.0
    assert polls.call_count <= 11  # at most one a second over 10 s


def test_poll_intervals_grow_by_half_and_stop_at_the_bound() -> None:
    gen = poll_intervals(1.0, 4.0)
    assert [next(gen) for _ in range(6)] == [1.0, 1.5, 2.25, 3.375, 4.0, 4.0]
