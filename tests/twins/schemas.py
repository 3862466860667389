"""The providers' published request and response schemas (``tests/contract/schemas/``), and how a
request is matched to its operation and checked against them.

Shared by the respx tests (``tests/test_provider_http.py``) and the twins (``tests/twins/server.py``),
so both hold the providers to the same documents.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import jsonschema

SCHEMAS = Path(__file__).resolve().parent.parent / "contract" / "schemas"


@functools.cache
def document(provider: str) -> dict[str, Any]:
    """``tests/contract/schemas/<provider>.json`` (runpod, vastai, lambda)."""
    return json.loads((SCHEMAS / f"{provider}.json").read_text())


def operations(provider: str) -> dict[str, Any]:
    return document(provider)["operations"]


def match(provider: str, method: str, path: str) -> tuple[str, dict[str, str]] | None:
    """``(operationId, path parameters)`` of the REST operation at ``method path``, or None.
    A trailing slash is ignored (Vast's CLI sends one; its document lists paths without)."""
    path = path.rstrip("/") or "/"
    for op_id, op in operations(provider).items():
        if op["method"] != method.lower() or "request" not in op:
            continue  # GraphQL shares one path; it is told apart by its query, not here
        names = re.findall(r"\{([^}]+)\}", op["path"])
        pattern = re.sub(r"\\\{[^}]+\\\}", "([^/]+)", re.escape(op["path"]))
        found = re.fullmatch(pattern, path)
        if found:
            return op_id, dict(zip(names, map(unquote, found.groups()), strict=True))
    return None


def _typed_param(values: list[str], schema: dict[str, Any]) -> Any:
    """A query value as the JSON its schema types it (the URL carries text)."""
    kinds = {schema.get("type")} | {s.get("type") for s in schema.get("allOf", []) if isinstance(s, dict)}

    def one(text: str, item: dict[str, Any]) -> Any:
        item_kinds = {item.get("type")} | {s.get("type") for s in item.get("allOf", []) if isinstance(s, dict)}
        if "integer" in item_kinds and re.fullmatch(r"-?\d+", text):
            return int(text)
        if "number" in item_kinds:
            try:
                return float(text)
            except ValueError:
                return text
        if "boolean" in item_kinds and text in ("true", "false"):
            return text == "true"
        return text

    if "array" in kinds:
        return [one(v, schema.get("items") or {}) for v in values]
    return one(values[-1], schema)


def typed_query(items: Iterable[tuple[str, str]], schema: dict[str, Any]) -> dict[str, Any]:
    """Query parameters (name, text) as the JSON object the query schema describes."""
    values: dict[str, list[str]] = {}
    for name, value in items:
        values.setdefault(name, []).append(value)
    props = schema.get("properties", {})
    return {name: _typed_param(texts, props.get(name, {})) for name, texts in values.items()}


def _errors(schema: Any, value: Any, where: str) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{where}: {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))]


def request_errors(provider: str, op_id: str, query: Iterable[tuple[str, str]], content: bytes) -> list[str]:
    """Why the published document refuses this request (its query and JSON body); [] when it is fine."""
    op = operations(provider)[op_id]
    request = op.get("request")
    if request is None:  # RunPod's GraphQL: its input's shape where its official client gives one
        return _graphql_input_errors(op["input"], content) if "input" in op else []
    errors = _errors(request["query"], typed_query(query, request["query"]), "query")
    if request["body"] is None:
        if content.strip():
            errors.append("body: the document takes none, one was sent")
        return errors
    if not content.strip():
        return [*errors, "body: the document requires one, none was sent"]
    try:
        body = json.loads(content)
    except ValueError as exc:
        return [*errors, f"body: not JSON ({exc})"]
    return errors + _errors(request["body"], body, "body")


def _graphql_input_errors(schema: Any, content: bytes) -> list[str]:
    """Why a GraphQL request's ``variables.input`` breaks ``schema`` (sent as ``$input``, as the
    provider modules send it)."""
    try:
        body = json.loads(content)
    except ValueError as exc:
        return [f"body: not JSON ({exc})"]
    if not isinstance(body, dict) or not isinstance(body.get("query"), str):
        return ["body: a GraphQL request is an object with a query"]
    variables = body.get("variables")
    if not isinstance(variables, dict) or "input" not in variables:
        return ["variables: $input is required"]
    return _errors(schema, variables["input"], "variables.input")


def response_schema(provider: str, op_id: str, status: int) -> Any:
    """The schema of ``op_id``'s response with ``status`` (else its ``default``), or None if undocumented."""
    responses = operations(provider)[op_id]["responses"]
    return responses.get(str(status), responses.get("default"))


def response_errors(schema: Any, body: Any) -> list[str]:
    return _errors(schema, body, "response")
