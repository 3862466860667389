"""The server's request bodies and query parameters, checked against its committed JSON Schemas
(``schemas/*-request.json`` and ``schemas/*-query.json``) by the one machinery of
``core.bodies``, which the worker's API uses too.

The same files generate the sidebar's types (``labextension/src/types.ts``), so what the browser
may send and what the server takes are one document. A body or query a schema refuses is a
UsageError (a 400) whose message names the field and says what it must be; nothing is acted on.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator

from jupyter_portable.core.bodies import SchemaSet

SCHEMA_DIR = Path(__file__).parent / "schemas"


@functools.cache
def schemas() -> SchemaSet:
    """Every schema of the server's API, read once."""
    return SchemaSet({p.name: json.loads(p.read_text()) for p in sorted(SCHEMA_DIR.glob("*.json"))})


def validator(name: str) -> Draft7Validator:
    """The validator of ``schemas/<name>`` (e.g. ``snapshot-request.json``)."""
    return schemas().validator(name)


def read_body(raw: bytes | None, schema: str, *, allow: Collection[str] = ()) -> dict[str, Any]:
    """The request body ``raw`` (none: ``{}``), parsed strictly and checked against ``schema``."""
    return schemas().read_body(raw, schema, allow=allow)


def read_query(arguments: Mapping[str, list[bytes]], schema: str) -> dict[str, Any]:
    """The query parameters, typed as ``schema`` says and checked against it."""
    return schemas().read_query(arguments, schema)


def describe(schema: dict[str, Any]) -> str:
    """What a value of ``schema`` is, in words."""
    return schemas().describe(schema)


__all__ = ["SCHEMA_DIR", "describe", "read_body", "read_query", "schemas", "validator"]
