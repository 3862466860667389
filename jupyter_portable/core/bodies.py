"""Request bodies and query parameters, read strictly and checked against JSON Schemas (Draft 7).

One machinery for every HTTP boundary of the package: the server extension's API
(``interfaces/serverext/schemas``) and the worker's (``worker/schemas``) each hold a
:class:`SchemaSet` of their own files. A body or query a schema refuses is a UsageError (a 400,
``core.http_status``) whose message names the field and says what it must be, in the schema's
own terms (or its ``errorMessage``, the ajv-errors keyword, where those terms would not help a
person); nothing is acted on. The schemas are given as parsed JSON: reading them is the
boundary's (this module does no I/O).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Mapping
from typing import Any

from jsonschema import Draft7Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.validate import loads_strict, short_repr


class SchemaSet:
    """The schemas of one API under their file names, so ``reservation.json#/...`` resolves."""

    def __init__(self, schemas: Mapping[str, Any]) -> None:
        self.names = frozenset(schemas)
        self.registry: Registry[Any] = Registry().with_resources(
            (name, Resource.from_contents(schemas[name], default_specification=DRAFT7)) for name in sorted(schemas))
        self.validator = functools.cache(self._validator)

    def _validator(self, name: str) -> Draft7Validator:
        """The validator of schema ``name`` (e.g. ``snapshot-request.json``)."""
        schema = self.registry.contents(name)
        Draft7Validator.check_schema(schema)
        return Draft7Validator(schema, registry=self.registry)

    def read_body(self, raw: bytes | None, name: str, *, allow: Collection[str] = ()) -> dict[str, Any]:
        """The request body ``raw`` (none: ``{}``), parsed strictly and checked against schema ``name``.

        ``allow``: field names the schema lacks that are let through to be refused further in, in
        words of their own (a renamed setting is told what replaced it)."""
        # strict: no key twice, no NaN, bounded nesting (a deep body is a 400, not a RecursionError)
        obj = loads_strict(raw or b"{}", "the body", error=UsageError)
        checked = {k: v for k, v in obj.items() if k not in allow} if isinstance(obj, dict) else obj
        self.check(checked, name)
        return obj  # type: ignore[no-any-return]

    def read_query(self, arguments: Mapping[str, list[bytes]], name: str) -> dict[str, Any]:
        """The query parameters (tornado's ``request.query_arguments``) as schema ``name``'s types
        say (a number, an integer, true/false or text; given twice, the last), then checked."""
        props = self.validator(name).schema.get("properties", {})
        obj: dict[str, Any] = {}
        for key, values in arguments.items():
            text = values[-1].decode("utf-8", "replace") if values else ""
            if key.isdigit() and not text:
                continue  # JupyterLab's cache buster (ServerConnection appends "?<ms since 1970>" to GETs)
            obj[key] = _typed(text, props.get(key, {}))
        self.check(obj, name, what="the query")
        return obj

    def check(self, obj: Any, name: str, *, what: str = "the body") -> None:
        """A UsageError naming the first thing schema ``name`` refuses in ``obj``; nothing where it is valid."""
        v = self.validator(name)
        error = first_error(v, obj)
        if error is not None:
            raise UsageError(self.message(v, error, obj, what))

    def message(self, v: Draft7Validator, error: ValidationError, obj: Any, what: str = "the body") -> str:
        """One line naming what is wrong with ``obj``."""
        path = list(error.absolute_path)
        if not path:
            if error.validator == "type":
                return f"{what} must be a JSON object"
            if error.validator == "additionalProperties":
                unknown = sorted(set(obj) - set(v.schema.get("properties", {})))
                return f"unknown field(s): {', '.join(unknown)}"[:300]
            if error.validator == "required":
                missing = [f for f in v.schema.get("required", []) if f not in obj]
                return f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required"
            return f"{what}: {error.message}"[:300]
        field = str(path[0])
        prop = v.schema["properties"][field]
        said = prop["errorMessage"] if "errorMessage" in prop else f"{field} must be {self.describe(prop)}"
        return f"{said}, not {short_repr(obj[field])}"

    def describe(self, schema: dict[str, Any]) -> str:
        """What a value of ``schema`` is, in words: "a number of at least 0, "" or null"."""
        if "$ref" in schema:
            return self.describe(self.registry.resolver().lookup(schema["$ref"]).contents)
        if "errorMessage" in schema:
            return str(schema["errorMessage"])
        if "anyOf" in schema:
            return _or([self.describe(s) for s in schema["anyOf"]])
        if "enum" in schema:
            return "one of " + ", ".join(json.dumps(x) for x in schema["enum"])
        if "const" in schema:
            return json.dumps(schema["const"])
        types = schema.get("type", [])
        return _or([self._one_type(t, schema) for t in ([types] if isinstance(types, str) else types)])

    def _one_type(self, kind: str, schema: dict[str, Any]) -> str:
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
            return "a list" + (f" of {self.describe(items)}" if isinstance(items, dict) else "")
        return {"null": "null", "boolean": "true or false", "object": "an object"}.get(kind, kind)


def first_error(v: Draft7Validator, obj: Any) -> ValidationError | None:
    """The error to tell: the body's own (not an object, unknown or missing fields) before a field's,
    and the fields' in name order, so the same body always gets the same message."""
    errors = sorted(v.iter_errors(obj), key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path]))
    return errors[0] if errors else None


def _typed(text: str, prop: dict[str, Any]) -> Any:
    """A query parameter's text as its schema's type, or the text itself where it does not read
    as one (the schema then refuses it, naming what it must be)."""
    types = prop.get("type", "string")
    for kind in [types] if isinstance(types, str) else types:
        try:
            if kind == "integer":
                return int(text)
            if kind == "number":
                number = float(text)
                return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number
        except ValueError:
            continue
        if kind == "boolean" and text in ("true", "false", "1", "0"):
            return text in ("true", "1")
    return text


def _or(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


__all__ = ["SchemaSet", "first_error"]
