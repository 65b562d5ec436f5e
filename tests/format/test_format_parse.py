"""glcomp/format/parse.py and its browser twin glcomp/runtime/js/format/parse.js read the same
corpus of valid and invalid JSON and safetensors bytes alike: the same values, or the same
GlcompError (JSON syntax errors: the same message up to the parser's own detail)."""

from __future__ import annotations

import base64
import json
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save

import glcomp
from glcomp.errors import GlcompError
from glcomp.format.parse import parse_json, parse_safetensors

PARSE_JS = Path(glcomp.__file__).parent / "runtime" / "js" / "format" / "parse.js"


def _st(header: Any, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


JSON_CASES: dict[str, bytes] = {
    "object": b'{"a": [1, 2.5, "x"], "b": null}',
    "nested 64": b"[" * 64 + b"]" * 64,
    "nested 65": b"[" * 65 + b"]" * 65,
    "brackets in strings": b'["[[[[", "\\"]]"]',
    "not utf-8": b'{"a": "\xff"}',
    "byte order mark": b'\xef\xbb\xbf{"a": 1}',
    "syntax": b'{"a": 1,}',
    "empty": b"",
}

_GOOD = save({"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(7, np.int64)})
SAFETENSORS_CASES: dict[str, bytes] = {
    "good": _GOOD,
    "short": b"\x01\x02",
    "header too long": struct.pack("<Q", 10**6) + b"{}",
    "header not an object": _st([1, 2]),
    "unsupported dtype": _st({"w": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}}, b"\0\0"),
    "bad shape": _st({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
    "offsets outside": _st({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 4),
    "size mismatch": _st({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
    "gap": _st(
        {
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
        },
        b"\0" * 12,
    ),
    "trailing bytes": _st({"w": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8),
    "bad metadata": _st({"__metadata__": {"a": 1}}),
    "entry not an object": _st({"w": 3}),
}


def _python(kind: str, data: bytes) -> Any:
    try:
        if kind == "json":
            return {"value": parse_json(data, "t.json")}
        arrays = parse_safetensors(data, "t.safetensors")
        return {
            "value": {k: [str(v.dtype), list(v.shape), v.reshape(-1).tolist()] for k, v in arrays.items()}
        }
    except GlcompError as err:
        return {"error": str(err)}


def _node(cases: list[dict[str, str]]) -> list[Any]:
    node = shutil.which("node")
    assert node is not None, "node (installed with the npm toolchain) runs the JavaScript twin"
    script = f"""
import {{ parseJson, parseSafetensors }} from {json.dumps(PARSE_JS.as_uri())};
const cases = JSON.parse(await new Promise((ok) => {{
  let s = ""; process.stdin.on("data", (d) => (s += d)); process.stdin.on("end", () => ok(s));
}}));
const DT = {{ F32: "float32", F64: "float64", I32: "int32", I64: "int64" }};
const out = cases.map(({{ kind, data }}) => {{
  const bytes = new Uint8Array(Buffer.from(data, "base64"));
  try {{
    if (kind === "json") return {{ value: parseJson(bytes, "t.json") }};
    const t = parseSafetensors(bytes, "t.safetensors");
    const value = {{}};
    for (const [k, v] of Object.entries(t)) value[k] = [DT[v.dtype], v.shape, Array.from(v.data, Number)];
    return {{ value }};
  }} catch (err) {{
    if (err.name !== "GlcompError") throw err;
    return {{ error: err.message }};
  }}
}});
process.stdout.write(JSON.stringify(out));
"""
    done = subprocess.run(
        [node, "--input-type=module", "-e", script],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_javascript_parses_like_python() -> None:
    corpus = [("json", k, v) for k, v in JSON_CASES.items()]
    corpus += [("safetensors", k, v) for k, v in SAFETENSORS_CASES.items()]
    js = _node([{"kind": kind, "data": base64.b64encode(data).decode()} for kind, _, data in corpus])
    outcomes = set()
    for (kind, name, data), got in zip(corpus, js, strict=True):
        want = _python(kind, data)
        outcomes.add((kind, "error" in want))
        if "error" in want and want["error"].startswith("bundle t.json: not valid JSON ("):
            # the two JSON parsers word a syntax error apart; the rest of the message is the same
            assert got["error"].startswith("bundle t.json: not valid JSON ("), (name, got)
        else:
            assert got == want, (kind, name, got, want)
    # the corpus holds accepted and refused inputs of both kinds
    assert outcomes == {("json", True), ("json", False), ("safetensors", True), ("safetensors", False)}
