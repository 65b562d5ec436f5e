"""The resampling family: ``affine_gather`` fused into the kernel that reads it (no template of
its own; the map kernel's function of the node). Every value it computes is an integer held in a
float below 2^24, so GLSL ES 1.00 and 3.00 compute what the op's numpy reference computes bit for
bit; the floor division is corrected by its remainder, since GLSL's division is not exact.
"""

from __future__ import annotations

from glcomp.codegen.families.base import Lowering, RenderContext, register
from glcomp.codegen.families.glsl import glsl_float


def _coordinate(axis: str, m: list[str]) -> list[str]:
    """`axis`'s source index s<axis> = floor((a P + b Q + c) / max(d, 1)), exactly."""
    a, b, c, d = m
    u, dd, s, rem = f"u{axis}", f"d{axis}", f"s{axis}", f"r{axis}"
    return [
        f"float {u} = {a} * p + {b} * q + {c};",
        f"float {dd} = max({d}, 1.0);",
        f"float {s} = floor({u} / {dd});",
        f"float {rem} = {u} - {s} * {dd};",
        f"{s} += ({rem} >= {dd} ? 1.0 : 0.0) - ({rem} < 0.0 ? 1.0 : 0.0);",
    ]


def affine_gather_emit(r: RenderContext, n: int, args: list[str]) -> list[str]:
    """The pixel the per-sample map sends output pixel (i2, i3) to, read at clamped indices and
    then selected (no texture read under a branch), or the fill value outside the image."""
    g = r.graph
    x, m = g.operands(n)
    _, _, h, w = g.shape(x)
    oh, ow = g.shape(n)[2:]
    lines = [f"float m{k} = floor({r.call(m, [args[0], str(k)])});" for k in range(8)]
    lines += [f"float p = float(2 * {args[3]} + {1 - ow});", f"float q = float(2 * {args[2]} + {1 - oh});"]
    lines += _coordinate("x", ["m0", "m1", "m2", "m3"]) + _coordinate("y", ["m4", "m5", "m6", "m7"])
    read = r.call(x, [args[0], args[1], f"int(clamp(sy, 0.0, {h - 1}.0))", f"int(clamp(sx, 0.0, {w - 1}.0))"])
    inside = f"all(bvec4(sx >= 0.0, sx < {w}.0, sy >= 0.0, sy < {h}.0))"
    fill = glsl_float(g.attrs(n)["fill"])
    return lines + [f"float v = {read};", f"return {inside} ? v : {fill};"]


register(Lowering("affine_gather", "map", emit=affine_gather_emit))
