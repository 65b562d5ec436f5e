"""Parsing untrusted bundle files in bounded memory: JSON as the browser reads it, and
safetensors weights.

`parse_json` and `parse_safetensors` accept and refuse exactly what glcomp.js's parseJson and
parseSafetensors (glcomp/runtime/js/format/parse.js) do; any fault is a GlcompError naming the file, and
nothing else. Sizes, nesting and shapes are bounded before anything large is built. This module
imports nothing of glcomp but its errors and the format's helpers.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.format.jsonschema import short as _short

MAX_DIMS = 32  # of a tensor's shape (numpy's limit)
MAX_JSON_BYTES = 64 << 20  # every JSON file (and a weights file's header)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


MAX_JSON_DEPTH = 64
# The nesting pre-scan: escapes (a backslash and the character after it) removed first, then
# strings, so no pattern repeats a group (that took ~124 bytes of memory per byte of one long
# string); the brackets left give the depth. glcomp.js scans the same way.
_JSON_ESCAPE = re.compile(r"\\.", re.DOTALL)
_JSON_STRING = re.compile(r'"[^"]*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")
# Weights dtypes the runtimes take: float states, integer counters (as the browser runtime).
STATE_DTYPES = {"F32": "<f4", "F64": "<f8"}
COUNTER_DTYPES = {"I32": "<i4", "I64": "<i8"}
_DTYPE_SIZES = {"F32": 4, "F64": 8, "I32": 4, "I64": 8}


def _json_number(text: str) -> Any:
    """JSON numbers as the browser reads them: one kind of number, so 2.0 is the integer 2, and
    numbers too large for a double are infinite."""
    value = float(text)
    return int(value) if value.is_integer() else value


def _json_int(text: str) -> Any:
    return int(text) if len(text) <= 300 else float(text)


def parse_json(data: bytes, where: str, browser_numbers: bool = True) -> Any:
    """Parse untrusted JSON bytes as the browser runtime does (UTF-8, no NaN/Infinity literals,
    integral numbers are integers), refusing more than MAX_JSON_BYTES or MAX_JSON_DEPTH levels of
    nesting; any fault is a GlcompError naming `where`. ``browser_numbers=False`` keeps Python's
    reading of numbers (2.0 a float), for files only Python reads (program.json)."""
    if len(data) > MAX_JSON_BYTES:
        raise GlcompError(f"bundle {where}: larger than {MAX_JSON_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise GlcompError(f"bundle {where}: not valid JSON ({err})") from None
    depth = 0
    bare = _JSON_STRING.sub("", _JSON_ESCAPE.sub("", text))
    for mt in _JSON_BRACKET.finditer(bare):
        token = mt[0]
        if token in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise GlcompError(f"bundle {where}: nested deeper than {MAX_JSON_DEPTH} levels")
        elif token in "]}":
            depth -= 1
    try:
        return json.loads(
            text,
            parse_float=_json_number if browser_numbers else float,
            parse_int=_json_int,
            parse_constant=_no_constant,
        )
    except (ValueError, RecursionError) as err:
        raise GlcompError(f"bundle {where}: not valid JSON ({err})") from None


def parse_safetensors(data: bytes, where: str = "weights.safetensors") -> dict[str, np.ndarray]:
    """Parse a safetensors file strictly, exactly as the browser runtime's parseSafetensors: a
    header of at most MAX_JSON_BYTES, dtypes F32, F64, I32 or I64 only, shapes of sizes,
    offsets inside the file that neither overlap nor leave gaps. GlcompError naming `where`
    (and the tensor) otherwise. The arrays returned are copies, little-endian."""

    def fail(msg: str) -> GlcompError:
        return GlcompError(f"bundle {where}: unreadable ({msg})")

    if len(data) < 8:
        raise fail("file shorter than its 8-byte header length")
    length = int.from_bytes(data[:8], "little")
    if length > len(data) - 8 or length > 100_000_000:
        raise fail(f"header length {length} exceeds the file size {len(data)}")
    header = parse_json(data[8 : 8 + length], f"{where} header")
    if not isinstance(header, dict):
        raise fail("header is not a JSON object")
    start = 8 + length
    size = len(data) - start
    spans = []
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise fail("bad __metadata__")
            continue
        if not isinstance(info, dict):
            raise fail(f"entry {name!r} is not an object")
        dtype = info.get("dtype")
        if not isinstance(dtype, str) or dtype not in _DTYPE_SIZES:
            raise fail(
                f"tensor {name!r} has unsupported dtype {_short(dtype)} (F32, F64, I32 or I64 expected)"
            )
        shape, offs = info.get("shape"), info.get("data_offsets")
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_DIMS
            or not all(_is_int(s) and s >= 0 for s in shape)
        ):
            raise fail(f"tensor {name!r} has a bad shape")
        if (
            not isinstance(offs, list)
            or len(offs) != 2
            or not all(_is_int(o) and o >= 0 for o in offs)
            or offs[1] < offs[0]
            or offs[1] > size
        ):
            raise fail(f"tensor {name!r} has data offsets outside the file")
        n = math.prod(shape)
        if offs[1] - offs[0] != n * _DTYPE_SIZES[dtype]:
            raise fail(f"tensor {name!r}: {offs[1] - offs[0]} bytes for shape {tuple(shape)}")
        spans.append((offs[0], offs[1]))
        np_dtype = {**STATE_DTYPES, **COUNTER_DTYPES}[dtype]
        try:
            out[name] = np.frombuffer(data, np_dtype, n, start + offs[0]).reshape(shape).copy()
        except (ValueError, OverflowError) as err:
            raise fail(f"tensor {name!r}: {err}") from None
    end = 0
    for b, e in sorted(spans):
        if b != end:
            raise fail("tensor data overlaps or leaves gaps")
        end = e
    if end != size:
        raise fail("the file holds bytes no tensor covers")
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")
