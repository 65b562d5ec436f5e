"""A small interpreter of the JSON Schema keywords glcomp's manifest schema uses.

glcomp/runtime/js/format/jsonschema.js is the same interpreter in JavaScript: for any JSON value and schema
both accept the same values, and report the first fault they meet in the same order with the
same message. Supported: ``type`` (object, array, string, integer, number, boolean, null; a
list of them), ``const``, ``enum``, ``pattern`` (anchored ``^...$``, ECMAScript syntax common to
Python's re), ``format: "state-name"``, ``minLength``/``maxLength``, ``minimum``/``maximum``,
``items``, ``minItems``/``maxItems``, ``properties``, ``required``, ``additionalProperties``
(false or a schema), ``propertyNames``, ``minProperties``/``maxProperties``, ``anyOf`` and local
``$ref`` (``#/$defs/NAME``). Any other keyword but annotations is refused when the schema is
loaded (`check_keywords`), so the schema cannot silently mean more than both interpreters check.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from glcomp.errors import GlcompError

KEYWORDS = {
    "type", "const", "enum", "pattern", "format", "minLength", "maxLength", "minimum", "maximum",
    "items", "minItems", "maxItems", "properties", "required", "additionalProperties",
    "propertyNames", "minProperties", "maxProperties", "anyOf", "$ref",
}  # fmt: skip
ANNOTATIONS = {"$schema", "$id", "$defs", "$comment", "title", "description"}
TYPE_NAMES = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "null": "null",
}
FORMATS = ("state-name",)


def state_name_ok(name: Any) -> bool:
    """State names (parameters, buffers, optimizer state, counters) are torch names and may hold
    any printable character, spaces, tabs and newlines: they live only in JSON and the weights
    file, never in file paths or GLSL."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= 500
        and all(ch.isprintable() or ch in "\t\n\r" for ch in name)
    )


def short(v: Any) -> str:
    """`v` for a message, cut short (a hostile manifest may hold huge or deeply nested values):
    strings quoted as 'x', anything else as JSON."""
    try:
        text = repr(v) if isinstance(v, str) else json.dumps(v)
    except (ValueError, TypeError, RecursionError):
        text = type(v).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def fmt_list(items: list[Any]) -> str:
    """A list for a message, as Python writes it (['a', 'b']), cut short."""
    text = repr(list(items)) if all(isinstance(x, str) for x in items) else short(list(items))
    return text if len(text) <= 300 else text[:297] + "..."


def type_of(v: Any) -> str | None:
    """The JSON type of `v` ("integer" for integral numbers), None for anything JSON lacks."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number" if math.isfinite(v) else None
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return None


def _has_type(v: Any, wanted: str) -> bool:
    t = type_of(v)
    return t == wanted or (wanted == "number" and t == "integer")


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: booleans are not numbers, 1 and 1.0 are one number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if type_of(a) in ("integer", "number") and type_of(b) in ("integer", "number"):
        return a == b
    return type(a) is type(b) and a == b


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _pattern(p: str) -> re.Pattern[str]:
    if p not in _PATTERNS:
        if not (p.startswith("^") and p.endswith("$")):
            raise ValueError(f"schema pattern {p!r} must be anchored (^...$)")
        _PATTERNS[p] = re.compile(p[1:-1])  # used with fullmatch: Python's $ would allow a final \n
    return _PATTERNS[p]


def check_keywords(schema: Any, where: str = "#") -> None:
    """Raise ValueError if `schema` uses a keyword or format this interpreter does not know."""
    if not isinstance(schema, dict):
        raise ValueError(f"{where}: a schema must be an object")
    for key, sub in schema.items():
        if key not in KEYWORDS and key not in ANNOTATIONS:
            raise ValueError(f"{where}: unsupported keyword {key!r}")
        if key in ("items", "propertyNames") or (key == "additionalProperties" and sub is not False):
            check_keywords(sub, f"{where}/{key}")
        elif key in ("properties", "$defs"):
            for name, s in sub.items():
                check_keywords(s, f"{where}/{key}/{name}")
        elif key == "anyOf":
            for i, s in enumerate(sub):
                check_keywords(s, f"{where}/anyOf/{i}")
        elif key == "format" and sub not in FORMATS:
            raise ValueError(f"{where}: unsupported format {sub!r}")
        elif key == "pattern":
            _pattern(sub)


class Validator:
    """Validates JSON values against `schema` (whose ``$defs`` resolve ``$ref``); faults raise
    GlcompError ``bundle {where}: {path} ...``, where `path` is dotted (``states.w.layout``,
    ``draws[3]``) and the root is called `root`."""

    def __init__(self, schema: dict[str, Any], where: str, root: str = "manifest") -> None:
        check_keywords(schema)
        self.schema, self.where, self.root = schema, where, root

    def fail(self, path: str, msg: str) -> GlcompError:
        return GlcompError(f"bundle {self.where}: {path or self.root} {msg}")

    def _resolve(self, s: dict[str, Any]) -> dict[str, Any]:
        """`s`, or the definition its ``$ref`` names (sibling keywords of a ``$ref`` are ignored)."""
        return self.schema["$defs"][s["$ref"].removeprefix("#/$defs/")] if "$ref" in s else s

    def validate(self, value: Any, schema: dict[str, Any] | None = None, path: str = "") -> None:
        s = self._resolve(self.schema if schema is None else schema)
        if "anyOf" in s:
            self._any_of(value, s["anyOf"], path)
        if "type" in s:
            types = s["type"] if isinstance(s["type"], list) else [s["type"]]
            if not any(_has_type(value, t) for t in types):
                raise self.fail(
                    path, f"must be {' or '.join(TYPE_NAMES[t] for t in types)}, got {short(value)}"
                )
        if "const" in s and not json_equal(value, s["const"]):
            raise self.fail(path, f"must be {short(s['const'])}, got {short(value)}")
        if "enum" in s and not any(json_equal(value, e) for e in s["enum"]):
            raise self.fail(path, f"must be one of {fmt_list(s['enum'])}, got {short(value)}")
        t = type_of(value)
        if t == "string":
            self._string(value, s, path)
        elif t in ("integer", "number"):
            lo, hi = s.get("minimum"), s.get("maximum")
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                raise self.fail(path, f"must be in [{short(lo)}, {short(hi)}], got {short(value)}")
        elif t == "array":
            self._size(len(value), s, "minItems", "maxItems", "items", path)
            if "items" in s:
                for i, item in enumerate(value):
                    self.validate(item, s["items"], f"{path}[{i}]")
        elif t == "object":
            self._object(value, s, path)

    def _any_of(self, value: Any, branches: list[Any], path: str) -> None:
        first: GlcompError | None = None
        for branch in branches:
            try:
                self.validate(value, branch, path)
                return
            except GlcompError as err:
                if first is None and _has_type(value, self._resolve(branch).get("type", "")):
                    first = err
        if first is not None:
            raise first
        kinds = [self._resolve(b).get("type", "") for b in branches]
        raise self.fail(
            path, f"must be {' or '.join(TYPE_NAMES.get(k, k) for k in kinds)}, got {short(value)}"
        )

    def _string(self, value: str, s: dict[str, Any], path: str) -> None:
        self._size(len(value), s, "minLength", "maxLength", "characters", path)
        if "pattern" in s and not _pattern(s["pattern"]).fullmatch(value):
            raise self.fail(path, f"must match {s['pattern']}, got {short(value)}")
        if s.get("format") == "state-name" and not state_name_ok(value):
            raise self.fail(path, f"is not a name of 1 to 500 printable characters, got {short(value)}")

    def _size(self, n: int, s: dict[str, Any], lo_key: str, hi_key: str, what: str, path: str) -> None:
        if n < s.get(lo_key, 0):
            raise self.fail(path, f"must have at least {s[lo_key]} {what}, got {n}")
        if hi_key in s and n > s[hi_key]:
            raise self.fail(path, f"must have at most {s[hi_key]} {what}, got {n}")

    def _object(self, value: dict[str, Any], s: dict[str, Any], path: str) -> None:
        prefix = f"{path}: " if path else ""
        missing = [k for k in s.get("required", ()) if k not in value]
        if missing:
            raise GlcompError(f"bundle {self.where}: {prefix}missing fields {fmt_list(missing)}")
        props = s.get("properties", {})
        extra = s.get("additionalProperties", True)
        if extra is False:
            unknown = sorted((k for k in value if k not in props), key=str)
            if unknown:
                known = fmt_list(list(props))
                raise GlcompError(
                    f"bundle {self.where}: {prefix}unknown fields {fmt_list(unknown)} (known: {known})"
                )
        if "propertyNames" in s:
            for k in value:
                try:
                    self.validate(k, s["propertyNames"], path)
                except GlcompError:
                    raise self.fail(path, f"has an invalid name {short(k)}") from None
        self._size(len(value), s, "minProperties", "maxProperties", "fields", path)
        for k, sub in props.items():
            if k in value:
                self.validate(value[k], sub, f"{path}.{k}" if path else k)
        if isinstance(extra, dict):
            for k, v in value.items():
                if k not in props:
                    self.validate(v, extra, f"{path}.{k}" if path else k)
