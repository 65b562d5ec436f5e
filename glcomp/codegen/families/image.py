"""The image family: `preprocess` (glcomp.ir.ops.image) fused into the kernel that reads it.

Its `emit` writes the integer arithmetic of glcomp.ir.ops.image.preprocess_ref in GLSL: the frame
and its column in the sheet, the two bilinear taps and their sixteenths per axis (or the crop
offset), the bytes read back from the sheet's k / 255 values, then one subtraction and one
product. Every intermediate is an integer-valued float below 2^24, so the shader's result equals
the reference bit for bit in both dialects, fused multiply-adds or not. Template: none of its
own (the map kernel's functions).
"""

from __future__ import annotations

from glcomp.codegen.families.base import Lowering, RenderContext, register
from glcomp.codegen.families.glsl import glsl_float
from glcomp.errors import GlcompError
from glcomp.ir.ops.image import GREY, STEPS


def _taps(axis: str, i: str, out: int, src: int) -> list[str]:
    """Lines computing the taps <axis>0, <axis>1 and the weight w<axis> of output index `i`
    (bilinear_taps of glcomp.ir.ops.image, in ints)."""
    return [
        f"int a{axis} = {8 * src} * (2 * {i} + 1) - {8 * out};",
        f"int q{axis} = (2 * (a{axis} > 0 ? a{axis} : 0) + {out}) / {2 * out};",
        f"int {axis}0 = q{axis} / {STEPS};",
        f"int w{axis} = {axis}0 >= {src - 1} ? 0 : q{axis} - {STEPS} * {axis}0;",
        f"{axis}0 = {axis}0 < {src - 1} ? {axis}0 : {src - 1};",
        f"int {axis}1 = {axis}0 + 1 < {src} ? {axis}0 + 1 : {src - 1};",
    ]


def _per_channel(c: str, values: list[str]) -> str:
    """The value of channel `c` (0, 1 or 2) among three literals."""
    return f"({c} == 0 ? {values[0]} : ({c} == 1 ? {values[1]} : {values[2]}))"


def preprocess_emit(r: RenderContext, n: int, args: list[str]) -> list[str]:
    g = r.graph
    src = g.operands(n)[0]
    a = g.attrs(n)
    lay = r.layouts.get(src)
    if lay is not None and (lay.width != g.shape(src)[2] or lay.pages != 1):
        raise GlcompError(
            f"preprocess: the frame sheet of {a['batch']} frames of {a['source'][0]}x{a['source'][1]} "
            f"needs a {g.shape(src)[2]}-texel-wide texture; the target allows {lay.width}: "
            "use smaller frames or a smaller batch"
        )
    hs, ws = a["source"]
    h, w = a["size"]
    cols = a["columns"]
    lines = [f"int fq = {args[0]} / {cols};", f"int fx = ({args[0]} - fq * {cols}) * {ws};"]

    def byte(y: str, x: str, ch: str) -> str:
        return f"floor({r.call(src, ['fq', y, f'fx + {x}', ch])} * 255.0 + 0.5)"

    channels = ["0", "1", "2"] if a["grey"] else [args[1]]
    if a["mode"] == "resize":
        lines += _taps("y", args[2], h, hs) + _taps("x", args[3], w, ws)
        lines += ["float sy = float(wy);", "float sx = float(wx);", "float v = 0.0;"]
        s = glsl_float(STEPS)
        for k, ch in enumerate(channels):
            row0 = f"{byte('y0', 'x0', ch)} * ({s} - sx) + {byte('y0', 'x1', ch)} * sx"
            row1 = f"{byte('y1', 'x0', ch)} * ({s} - sx) + {byte('y1', 'x1', ch)} * sx"
            lines.append(f"float c{k} = ({row0}) * ({s} - sy) + ({row1}) * sy;")
    else:
        y, x = f"({args[2]} + {a['top']})", f"({args[3]} + {a['left']})"
        lines.append("float v = 0.0;")
        for k, ch in enumerate(channels):
            lines.append(f"float c{k} = {byte(y, x, ch)} * {glsl_float(STEPS * STEPS)};")
    units = STEPS * STEPS
    if a["grey"]:
        lines.append(
            f"v = c0 * {glsl_float(GREY[0])} + c1 * {glsl_float(GREY[1])} + c2 * {glsl_float(GREY[2])};"
        )
        units *= 256
        m, k = glsl_float(a["offset"][0]), glsl_float(a["gain"][0])
    else:
        lines.append("v = c0;")
        c = args[1]
        m, k = (_per_channel(c, [glsl_float(v) for v in a[key]]) for key in ("offset", "gain"))
    lines.append(f"float p = v * {glsl_float(1.0 / units)};")
    lines.append(f"return (p - {m}) * {k};")
    return lines


register(Lowering("preprocess", "map", emit=preprocess_emit))
