"""Property-based, over the real server: arbitrary bodies and parameters sent to every REST
endpoint of the server extension get a 2xx or a 4xx with a message, never a 500, and after
all of them the workspace's settings, reservations, routes and state still read back."""

# ruff: noqa: F811 - the fixtures imported from jupyter_e2e are taken as arguments of the same name
from __future__ import annotations

import json
import math
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from jupyter_e2e import env, jp_root_dir, make_workspace, portable_env, release_all  # noqa: F401 - fixtures

from jupyter_portable.core.validate import loads_strict

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = pytest.mark.timeout(300)

SETTING_FIELDS = ["gpus", "gpu_count", "min_gpu_memory_gb", "driver", "min_cuda", "container_image", "machine_image",
                  "max_price_per_hour",
                  "regions", "budget_total", "budget_warn_fraction", "hours", "autosnapshot_minutes"]


def _draw(strategy: st.SearchStrategy[Any], n: int) -> list[Any]:
    """``n`` values from ``strategy``, drawn by Hypothesis (the server calls are async, so they
    are made afterwards; a failure names the body that caused it)."""
    out: list[Any] = []

    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value: Any) -> None:
        out.append(value)

    collect()
    return out


scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.sampled_from([0, -1, 0.5, 2**63, 10**30, 1e308, math.nan, math.inf, -math.inf, ""])
           | st.floats() | st.text(max_size=12))
json_values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=3)
                           | st.dictionaries(st.text(max_size=6), kids, max_size=3), max_leaves=8)
times = st.sampled_from(["9999-12-31T23:00Z", "0001-01-01", "0001-01-01T00:30+01:00", "9999-12-31T23:00-05:00",
                         "2030-01-01T10:00Z", "tomorrow", "2026-12-01T09:00"]) | st.text(max_size=30)


def _body(fields: list[str], values: st.SearchStrategy[Any]) -> st.SearchStrategy[str]:
    """JSON text (NaN and Infinity included, as Python and careless clients write them): objects
    with the endpoint's fields, arbitrary JSON, or not JSON at all."""
    objects = st.dictionaries(st.sampled_from(fields), values, max_size=4) | st.dictionaries(
        st.sampled_from(fields) | st.text(max_size=5), values, max_size=2)
    return (objects.map(json.dumps) | json_values.map(json.dumps)
            | st.sampled_from(["", "{", "[1]", "null", '{"a": 1, "a": 2}', "\udcff"]))


async def _send(jp_fetch: Any, method: str, path: list[str], body: str | None = None,
                params: dict[str, str] | None = None) -> tuple[int, Any]:
    from tornado.httpclient import HTTPClientError

    try:
        resp = await jp_fetch("portable", "api", *path, method=method, params=params,
                              body=None if body is None else body.encode("utf-8", "surrogatepass"))
        return resp.code, json.loads(resp.body) if resp.body else None
    except HTTPClientError as exc:
        answer = json.loads(exc.response.body) if exc.response is not None and exc.response.body else None
        return exc.code, answer


def _starts_a_continue(text: str) -> bool:
    """A body ContinueHandler accepts without a route would rent a machine: not part of this test."""
    try:
        obj = json.loads(text or "{}")
    except ValueError:
        return False
    return isinstance(obj, dict) and set(obj) <= {"route"} and obj.get("route") is None


async def test_no_request_body_or_parameter_gets_a_500(jp_serverapp: Any, jp_fetch: Any, jp_root_dir: Path) -> None:
    cases: list[tuple[str, list[str], str | None, dict[str, str] | None]] = []
    cases += [("PUT", ["settings"], b, None) for b in _draw(_body(SETTING_FIELDS, json_values | st.sampled_from(
        ["550.54.15", "12.4", ["H100"], 4, 0.5])), 40)]
    cases += [("POST", ["reservations"], b, None) for b in _draw(_body(
        ["offer", "start", "hours", "charge"],
        st.sampled_from(["local/a100", "local/nope", "nope", "now", "before", 1, 2, 0, 1e9]) | times | scalars),
        40)]
    cases += [("POST", ["continue"], b, None) for b in _draw(_body(["route"], st.sampled_from(
        ["r-0123456789", "r-", "r-" + "9" * 60]) | scalars), 30) if not _starts_a_continue(b)]
    cases += [("POST", ["snapshot"], b, None) for b in _draw(_body(["message"], scalars), 15)]
    cases += [("POST", [verb], b, None) for verb in ("stop", "cancel")
              for b in _draw(_body(["force"], scalars), 10) if b.strip() not in ("{}", "")]
    cases += [("DELETE", ["reservations", urllib.parse.quote(rid, safe="")], None, None)
              for rid in _draw(st.text(min_size=1, max_size=40), 10)]
    cases += [("GET", [path], None, {name: value}) for path, name in (("routes", "hours"), ("reservations", "days"))
              for value in _draw(st.sampled_from(["nan", "inf", "-1", "0", "1e400", "365"]) | st.text(max_size=8), 10)]

    # the examples of issue 10, each of which once poisoned the workspace or answered 500
    cases += [("PUT", ["settings"], body, None) for body in (
        '{"hours": NaN}', '{"hours": Infinity}', '{"budget_total": -Infinity}', '{"hours": 0}',
        '{"gpu_count": 0.5}', '{"max_price_per_hour": 1e400}')]
    cases += [("POST", ["reservations"], json.dumps({"offer": "local/a100", "start": start, "hours": 1}), None)
              for start in ("9999-12-31T23:00Z", "0001-01-01T00:00Z", "0001-01-01T00:30+01:00",
                            "9999-12-31T23:00-05:00")]

    failures = []
    for method, path, body, params in cases:
        code, answer = await _send(jp_fetch, method, path, body, params)
        if code >= 500 or (code >= 400 and not (isinstance(answer, dict) and answer.get("error"))):
            failures.append((method, "/".join(path), body, params, code, answer))
    assert not failures, failures[:5]

    # whatever was accepted, the workspace still reads back, as strict JSON the sidebar can parse
    for path in (["settings"], ["reservations"], ["routes"], ["state"]):
        resp = await jp_fetch("portable", "api", *path)
        loads_strict(resp.body, "/".join(path))


async def test_hours_too_large_for_a_float_is_a_400(jp_serverapp: Any, jp_fetch: Any, jp_root_dir: Path) -> None:
    """Issue 28: ``hours: 10**400`` on reservations answered 500 (float() overflowed)."""
    for hours in ("1" + "0" * 400, "-" + "1" + "0" * 400, "337"):
        body = f'{{"offer": "local/a100", "start": "2030-01-01T10:00Z", "hours": {hours}}}'
        code, answer = await _send(jp_fetch, "POST", ["reservations"], body)
        assert code == 400, (hours[:5], code, answer)
        assert "hours must be a whole number from 1 to 336" in answer["error"]
    assert json.loads((await jp_fetch("portable", "api", "reservations")).body)["reservations"] == []
