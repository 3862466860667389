"""Request bodies, read strictly and checked against their committed JSON Schemas.

The same files (``schemas/*-request.json``) generate the sidebar's types
(``labextension/src/types.ts``), so what the browser may send and what the server takes are one
document. A body a schema refuses is a UsageError (a 400) whose message names the field and says
what it must be, in the schema's own terms (or its ``errorMessage``, the ajv-errors keyword, where
those terms would not help a person); nothing is acted on.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.validate import loads_strict, short_repr

SCHEMA_DIR = Path(__file__).parent / "schemas"


@functools.cache
def _registry() -> Registry[Any]:
    """Every schema of the API under its file name, so ``reservation.json#/...`` resolves."""
    return Registry().with_resources(
        (p.name, Resource.from_contents(json.loads(p.read_text()), default_specification=DRAFT7))
        for p in sorted(SCHEMA_DIR.glob("*.json")))


@functools.cache
def validator(name: str) -> Draft7Validator:
    """The validator of ``schemas/<name>`` (e.g. ``snapshot-request.json``)."""
    schema = _registry().contents(name)
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema, registry=_registry())


def read_body(raw: bytes | None, schema: str, *, allow: Collection[str] = ()) -> dict[str, Any]:
    """The request body ``raw`` (none: ``{}``), parsed strictly and checked against ``schema``.

    ``allow``: field names the schema lacks that are let through to be refused further in, in
    words of their own (a renamed setting is told what replaced it)."""
    # strict: no key twice, no NaN, bounded nesting (a deep body is a 400, not a RecursionError)
    obj = loads_strict(raw or b"{}", "the body", error=UsageError)
    checked = {k: v for k, v in obj.items() if k not in allow} if isinstance(obj, dict) else obj
    error = first_error(validator(schema), checked)
    if error is not None:
        raise UsageError(message(validator(schema), error, checked))
    return obj  # type: ignore[no-any-return]


def first_error(v: Draft7Validator, obj: Any) -> ValidationError | None:
    """The error to tell: the body's own (not an object, unknown or missing fields) before a field's,
    and the fields' in name order, so the same body always gets the same message."""
    errors = sorted(v.iter_errors(obj), key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path]))
    return errors[0] if errors else None


def message(v: Draft7Validator, error: ValidationError, obj: Any) -> str:
    """One line naming what is wrong with the body."""
    path = list(error.absolute_path)
    if not path:
        if error.validator == "type":
            return "the body must be a JSON object"
        if error.validator == "additionalProperties":
            unknown = sorted(set(obj) - set(v.schema.get("properties", {})))
            return f"unknown field(s): {', '.join(unknown)}"[:300]
        if error.validator == "required":
            missing = [f for f in v.schema.get("required", []) if f not in obj]
            return f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required"
        return f"the body: {error.message}"[:300]
    field = str(path[0])
    prop = v.schema["properties"][field]
    if "errorMessage" in prop:
        said = prop["errorMessage"]
    else:
        said = f"{field} must be {describe(prop)}"
    return f"{said}, not {short_repr(obj[field])}"


def describe(schema: dict[str, Any]) -> str:
    """What a value of ``schema`` is, in words: "a number of at least 0, "" or null"."""
    if "$ref" in schema:
        return describe(_registry().resolver().lookup(schema["$ref"]).contents)
    if "errorMessage" in schema:
        return str(schema["errorMessage"])
    if "anyOf" in schema:
        return _or([describe(s) for s in schema["anyOf"]])
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(x) for x in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    types = schema.get("type", [])
    return _or([_one_type(t, schema) for t in ([types] if isinstance(types, str) else types)])


def _one_type(kind: str, schema: dict[str, Any]) -> str:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if kind == "integer" and lo is not None and hi is not None:
        return f"a whole number from {lo} to {hi}"
    if kind in ("number", "integer"):
        bounds = [f"at least {lo}" if lo is not None else None,
                  f"above {schema['exclusiveMinimum']}" if "exclusiveMinimum" in schema else None,
                  f"at most {hi}" if hi is not None else None,
                  f"below {schema['exclusiveMaximum']:g}" if "exclusiveMaximum" in schema else None]
        words = " and ".join(b for b in bounds if b)
        return ("a whole number" if kind == "integer" else "a number") + (f" ({words})" if words else "")
    if kind == "string":
        limits = [f"at most {schema['maxLength']} characters" if "maxLength" in schema else None,
                  f"matching {schema['pattern']}" if "pattern" in schema else None]
        words = ", ".join(b for b in limits if b)
        return "text" + (f" ({words})" if words else "")
    if kind == "array":
        items = schema.get("items")
        return "a list" + (f" of {describe(items)}" if isinstance(items, dict) else "")
    return {"null": "null", "boolean": "true or false", "object": "an object"}.get(kind, kind)


def _or(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


__all__ = ["SCHEMA_DIR", "describe", "read_body", "validator"]
