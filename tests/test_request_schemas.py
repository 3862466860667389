"""Every request body of the REST API is checked against its committed JSON Schema
(interfaces/serverext/schemas/*-request.json, the files the sidebar's types are generated from):
a body only the schema refuses gets a 400 that names the field, over the real server, and nothing
is acted on (issue 31 item 2)."""

# ruff: noqa: F811 - the fixtures imported from jupyter_e2e are taken as arguments of the same name
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import env, jp_root_dir, make_workspace, portable_env, release_all  # noqa: F401 - fixtures

from jupyter_portable.core.calendar import MAX_HOURS
from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.settings import FIELD_NAMES
from jupyter_portable.interfaces.serverext import requests

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = pytest.mark.timeout(300)

# method, endpoint, the schema its body is checked against, a body that schema takes
ENDPOINTS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("POST", "continue", "continue-request.json", {}),
    ("POST", "cancel", "empty-request.json", {}),
    ("POST", "stop", "empty-request.json", {}),
    ("POST", "keep-running", "empty-request.json", {}),
    ("POST", "snapshot", "snapshot-request.json", {}),
    ("POST", "reservations", "reservation-request.json",
     {"offer": "local/a100", "start": "2030-01-01T10:00Z", "hours": 2}),
    ("PUT", "settings", "settings-request.json", {}),
    ("POST", "orphans", "orphans-request.json", {"terminate": "local/al-x"}),
]
# values to try in each field: each that the field's schema refuses is sent
CANDIDATES: list[Any] = [{"a": 1}, [1], True, "x" * 1001, "", "r-" + "9" * 60, "nope", -5, 0, 0.5, 10**400, None]


def _refused(schema: str, base: dict[str, Any], field: str) -> list[Any]:
    v = requests.validator(schema)
    return [c for c in CANDIDATES if not v.is_valid({**base, field: c})]


def test_every_request_schema_is_one_an_endpoint_checks_its_body_against() -> None:
    committed = {p.name for p in requests.SCHEMA_DIR.glob("*-request.json")}
    assert committed == {schema for _, _, schema, _ in ENDPOINTS}
    for _, _, schema, base in ENDPOINTS:
        assert requests.validator(schema).is_valid(base), schema
        for field in requests.validator(schema).schema.get("properties", {}):
            assert _refused(schema, base, field), f"{schema}: no candidate value is refused in {field}"


def test_the_schemas_hold_the_servers_rules() -> None:
    hours = requests.validator("reservation-request.json").schema["properties"]["hours"]
    assert (hours["type"], hours["minimum"], hours["maximum"]) == ("integer", 1, MAX_HOURS)
    assert set(requests.validator("settings-request.json").schema["properties"]) == set(FIELD_NAMES)


@pytest.mark.parametrize(("schema", "body", "said"), [
    ("snapshot-request.json", b"[1]", "the body must be a JSON object"),
    ("snapshot-request.json", b'{"message": "m", "force": 1, "at": 2}', "unknown field(s): at, force"),
    ("reservation-request.json", b'{"start": "2030-01-01T10:00Z"}', "offer, hours are required"),
    ("reservation-request.json", b'{"offer": "local/a100", "start": "s", "hours": 1' + b"0" * 400 + b"}",
     "hours must be a whole number from 1 to 336, not 1000"),
    ("reservation-request.json", b'{"offer": "local/a100", "start": "s", "hours": 2, "charge": "later"}',
     "charge must be one of \"now\", \"before\", not 'later'"),
    ("reservation-request.json", b'{"offer": "local/a100", "start": "s", "hours": 2, "max_price": -1}',
     "max_price must be a number (at least 0 and below 1e+09) or null, not -1"),
    ("settings-request.json", b'{"gpu_count": "two"}', "gpu_count must be a number (at least 0), \"\" or null"),
    ("settings-request.json", b'{"gpus": ["H100", 4]}', "gpus must be a list of text, \"\" or null"),
    ("continue-request.json", b'{"route": "best"}', "route must be a route id such as r-0123456789, or null"),
    ("orphans-request.json", b"{}", "terminate is required"),
])
def test_a_refused_body_is_told_what_the_field_must_be(schema: str, body: bytes, said: str) -> None:
    with pytest.raises(UsageError) as refused:
        requests.read_body(body, schema)
    assert said in str(refused.value)
    assert len(str(refused.value)) < 400  # a huge value is cut, never echoed whole


async def test_each_endpoint_refuses_what_its_schema_refuses_naming_the_field(
        jp_serverapp: Any, jp_fetch: Any, jp_root_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tornado.httpclient import HTTPClientError

    import jupyter_portable.interfaces.serverext as serverext

    checked_with: list[str] = []
    real = serverext.read_body

    def recording(raw: bytes | None, schema: str, **kw: Any) -> dict[str, Any]:
        checked_with.append(schema)
        return real(raw, schema, **kw)

    monkeypatch.setattr(serverext, "read_body", recording)
    settings_before = json.loads((await jp_fetch("portable", "api", "settings")).body)
    sent = 0
    for method, endpoint, schema, base in ENDPOINTS:
        fields = list(requests.validator(schema).schema.get("properties", {})) + ["zz_unknown"]
        for field in fields:
            for bad in _refused(schema, base, field) if field != "zz_unknown" else [1]:
                body = json.dumps({**base, field: bad})
                with pytest.raises(UsageError) as expected:
                    requests.read_body(body.encode(), schema)
                checked_with.clear()
                with pytest.raises(HTTPClientError) as refused:
                    await jp_fetch("portable", "api", *endpoint.split("/"), method=method, body=body)
                answer = json.loads(refused.value.response.body)
                where = (endpoint, field, bad if not isinstance(bad, int) or abs(bad) < 10**9 else "huge")
                assert refused.value.code == 400, (where, answer)
                assert checked_with == [schema], where
                assert answer["error"] == str(expected.value), where
                assert field in answer["error"], where
                sent += 1
    assert sent > 40
    # nothing was acted on: no booking, no setting changed, no Continue started, no version published
    reservations = json.loads((await jp_fetch("portable", "api", "reservations")).body)
    assert reservations["reservations"] == []
    assert json.loads((await jp_fetch("portable", "api", "settings")).body) == settings_before
    state = json.loads((await jp_fetch("portable", "api", "state")).body)
    assert state["continuing"] is False and state["lifecycle"]["state"] == "IDLE", state


# endpoint, a query its schema refuses, what the 400 says (the schema's own words), a query it takes
QUERIES: list[tuple[str, dict[str, str], str, dict[str, str]]] = [
    ("routes", {"hours": "soon"}, "hours must be a number (at least 0.01 and at most 8760), not 'soon'",
     {"hours": "8"}),
    ("routes", {"hours": "0"}, "hours must be a number (at least 0.01 and at most 8760), not 0", {"hours": "0.5"}),
    ("reservations", {"days": "40"}, "days must be a whole number from 1 to 31, not 40", {"days": "3"}),
    ("reservations", {"days": "2.5"}, "days must be a whole number from 1 to 31, not '2.5'", {}),
    ("orphans", {"refresh": "yes"}, "refresh must be one of 0, 1, not 'yes'", {"refresh": "0"}),
    ("routes", {"hour": "8"}, "unknown field(s): hour", {}),
]


async def test_each_query_is_checked_against_its_schema_naming_the_parameter(
        jp_serverapp: Any, jp_fetch: Any, jp_root_dir: Path) -> None:
    """Issue 46: the server's query parameters are checked by the same machinery as its bodies
    (schemas/*-query.json): a refused one is a 400 in the error answer's shape, and a good one is taken."""
    from tornado.httpclient import HTTPClientError

    shape = requests.validator("error.json")
    for endpoint, bad, said, good in QUERIES:
        with pytest.raises(UsageError, match="^" + said.replace("(", r"\(").replace(")", r"\)") + "$"):
            requests.read_query({k: [v.encode()] for k, v in bad.items()}, f"{endpoint}-query.json")
        with pytest.raises(HTTPClientError) as refused:
            await jp_fetch("portable", "api", endpoint, params=bad)
        answer = json.loads(refused.value.response.body)
        assert refused.value.code == 400 and shape.is_valid(answer), (endpoint, bad, answer)
        assert answer == {"error": said, "hint": None}, (endpoint, bad)
        assert (await jp_fetch("portable", "api", endpoint, params=good)).code == 200, (endpoint, good)


async def test_jupyterlabs_cache_buster_is_no_query_parameter(
        jp_serverapp: Any, jp_fetch: Any, jp_root_dir: Path) -> None:
    """JupyterLab's ServerConnection appends "?<ms since 1970>" to every GET (cache: no-store): the
    sidebar's `routes?hours=8&1796581234229` is the hours alone, not an unknown field (issue 43)."""
    from jupyter_portable.interfaces.serverext import requests

    assert requests.read_query({"hours": [b"8"], "1796581234229": [b""]}, "routes-query.json") == {"hours": 8}
    answer = await jp_fetch("portable", "api", "routes", params={"hours": "8", "1796581234229": ""})
    assert answer.code == 200 and json.loads(answer.body)["hours"] == 8
