"""The packing rule has one Python statement (glcomp.format.packing) that the code generator and
both Python runtimes import, and a JavaScript twin (glcomp/runtime/js/format/packing.js pack/unpack) that
must place every element where it does: a corpus of layouts packed by both, compared bit for
bit, and unpacked back by both."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import glcomp
from glcomp.codegen import layout as codegen_layout
from glcomp.format.packing import Layout, layout_for, pack, unpack
from glcomp.runtime import packing as runtime_packing

PACKING_JS = Path(glcomp.__file__).parent / "runtime" / "js" / "format" / "packing.js"

# (shape, max texture side, forced width): scalars, rows shorter, equal and longer than a texel,
# padded rows, several pages, and a forced width.
CASES = [
    ((), 8, None),
    ((1,), 8, None),
    ((3,), 8, None),
    ((4,), 8, None),
    ((2, 5), 8, None),
    ((3, 4, 7), 4, None),
    ((17, 9), 4, None),
    ((2, 3, 8), 2, None),
    ((5, 6), 16, 4),
    ((0, 3), 8, None),
]


def test_codegen_and_runtimes_import_the_one_rule() -> None:
    assert codegen_layout.layout_for is layout_for and codegen_layout.Layout is Layout
    assert runtime_packing.pack is pack and runtime_packing.unpack is unpack


@pytest.mark.parametrize(("shape", "size", "width"), CASES)
def test_layout_holds_every_texel(shape: tuple[int, ...], size: int, width: int | None) -> None:
    lay = layout_for(shape, size, width)
    assert lay.row_texels == max(1, -(-lay.row_len // 4))
    assert lay.width * lay.height * lay.pages >= lay.texels
    assert lay.width <= size and lay.height <= size
    value = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    pages = pack(value, lay.to_json())
    assert len(pages) == lay.pages and all(p.shape == (lay.height, lay.width, 4) for p in pages)
    np.testing.assert_array_equal(unpack(pages, lay.to_json()), value)


def _node_packs(records: list[dict]) -> list[dict]:
    """What glcomp.js's pack and unpack make of each record's layout and values."""
    node = shutil.which("node")
    assert node is not None, "node (installed with the npm toolchain) runs the JavaScript twin"
    script = f"""
import {{ pack, unpack }} from {json.dumps(PACKING_JS.as_uri())};
const cases = JSON.parse(await new Promise((ok) => {{
  let s = ""; process.stdin.on("data", (d) => (s += d)); process.stdin.on("end", () => ok(s));
}}));
const b64 = (a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString("base64");
const out = cases.map(({{ layout, values }}) => {{
  const raw = Buffer.from(values, "base64"); // a view into Node's shared pool: copy its bytes
  const flat = new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength));
  const pages = pack(flat, layout);
  return {{ pages: pages.map(b64), back: b64(unpack(pages, layout)) }};
}});
process.stdout.write(JSON.stringify(out));
"""
    done = subprocess.run(
        [node, "--input-type=module", "-e", script],
        input=json.dumps(records),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_javascript_packs_like_python() -> None:
    rng = np.random.default_rng(0)
    records, values = [], []
    for shape, size, width in CASES:
        value = rng.standard_normal(shape).astype(np.float32)
        values.append(value)
        layout = layout_for(shape, size, width).to_json()
        records.append({"layout": layout, "values": base64.b64encode(value.tobytes()).decode()})
    for value, record, js in zip(values, records, _node_packs(records), strict=True):
        want = pack(value, record["layout"])
        got = [np.frombuffer(base64.b64decode(p), np.float32) for p in js["pages"]]
        assert len(got) == len(want), record["layout"]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w.reshape(-1))
        back = np.frombuffer(base64.b64decode(js["back"]), np.float32)
        np.testing.assert_array_equal(back, value.reshape(-1))
