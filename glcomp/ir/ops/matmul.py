"""Matrix product of two rank-2 tensors; the Tensor API flattens leading batch axes."""

from __future__ import annotations

from typing import Any

from glcomp.errors import GlcompError
from glcomp.ir.ops._samples import st
from glcomp.ir.ops.registry import Emitter, Op, register


def matmul_shape(a, b):
    if len(a) != 2 or len(b) != 2:
        raise GlcompError(f"matmul needs rank-2 operands, got {a} and {b}")
    if a[1] != b[0]:
        raise GlcompError(f"matmul size mismatch: {a} @ {b}")
    return (a[0], b[1])


def sample_matmul(draw):
    m, k, n = (draw(st().integers(1, 9)) for _ in range(3))
    return [(m, k), (k, n)], {}


def _matmul_grad(g, out, a, b):
    return g @ b.T, a.T @ g


def matmul_spec(r: Emitter, n: int) -> dict[str, Any]:
    """matmul.frag.j2's root: a dot product of length K of a row of A and a column of B."""
    g = r.graph
    a, b = g.operands(n)
    return {"K": g.shape(a)[1], "a": r.fn(a), "b": r.fn(b)}


def matmul_spec4(r: Emitter, n: int, textures: set[int]) -> dict[str, Any] | None:
    """matmul.frag.j2's root4: the texel (n[i0, j0 + c])_c; B read texel-wise when stored
    (b_tex), or through the stored matrix it transposes (w_tex); A along its rows when stored
    (a_tex), or down the columns of the stored matrix it transposes (at_tex); other fused operands
    through their vec4 functions (a4: A's texel along K, b4: a row of B)."""
    g = r.graph
    a, b = g.operands(n)
    spec = r.root4_head(n) | {
        "K": g.shape(a)[1],
        "N": g.shape(b)[1],
        "a": r.fn(a),
        "b": r.fn(b),
        "a_tex": r.texture(a, textures),
        "b_tex": r.texture(b, textures),
        "w_tex": None,
    }
    if spec["b_tex"] is None and g.op(b) == "permute" and tuple(g.attrs(b)["perm"]) == (1, 0):
        spec["w_tex"] = r.texture(g.operands(b)[0], textures)
    # A as the transpose of a stored (K, M) texture S (a weight gradient's x.T or g.T): A's four
    # values along K are one component of four texels of S, rows k ... k + 3 at column i0.
    spec["at_tex"] = None
    if spec["a_tex"] is None and g.op(a) == "permute" and tuple(g.attrs(a)["perm"]) == (1, 0):
        spec["at_tex"] = r.texture(g.operands(a)[0], textures)
    # Fused operands: A's texel along K and B's rows along N through their vec4 functions.
    spec["a4"] = r.fn4(a) if spec["a_tex"] is None and spec["at_tex"] is None else None
    spec["b4"] = r.fn4(b) if spec["b_tex"] is None and spec["w_tex"] is None else None
    return spec


def matmul_spec4t(r: Emitter, n: int, textures: set[int]) -> dict[str, Any] | None:
    """matmul.frag.j2's root4t: the column texel (n[j0 + c, i0])_c of the product read
    transposed."""
    g = r.graph
    a, b = g.operands(n)
    spec = {
        "transposed": True,
        "last": "i0",  # the cache is read by the row index
        "args4": "i0, j0",
        "K": g.shape(a)[1],
        "M": g.shape(a)[0],
        "a": r.fn(a),
        "b": r.fn(b),
        "s_tex": None,
        "b_tex": r.texture(b, textures),
    }
    if g.op(a) == "permute" and a not in textures:
        spec["s_tex"] = r.texture(g.operands(a)[0], textures)
    return spec


register(
    Op(
        "matmul",
        "matmul",
        matmul_shape,
        lambda a, b: a @ b,
        _matmul_grad,
        2,
        sample=sample_matmul,
        template="matmul",
        loop_extent=lambda shapes, attrs: shapes[0][1],
        spec=matmul_spec,
        spec4=matmul_spec4,
        spec4t=matmul_spec4t,
        rereads=True,
    )
)
