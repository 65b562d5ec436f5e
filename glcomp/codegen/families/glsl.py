"""GLSL text helpers for the ops' kernel hooks and the renderer: literals and index arithmetic.

Pure string functions of shapes and names; index expressions use the prelude's `imod`.
"""

from __future__ import annotations

import math

from glcomp.errors import GlcompError


def glsl_float(value: float) -> str:
    """`value` as a GLSL float literal (infinities clamp to +-3.0e38); NaN raises GlcompError."""
    if math.isnan(value):
        raise GlcompError("NaN constant in a kernel")
    if math.isinf(value):
        return "3.0e38" if value > 0 else "-3.0e38"
    text = repr(float(value))
    return text if any(c in text for c in ".e") else text + ".0"


def conjunction(conds: list[str]) -> str:
    """GLSL that is true when every one of the (side-effect free) boolean expressions `conds` is,
    written without `&&`: shader translators compile a short-circuit `&&` to a branch, and a
    software renderer's JIT compiles a branch many times slower than ``all(bvecN(...))``, which
    evaluates every operand (the same value: the operands have no effects)."""
    if len(conds) <= 1:
        return conds[0] if conds else "true"
    groups = [conds[i : i + 4] for i in range(0, len(conds), 4)]
    parts = [g[0] if len(g) == 1 else f"all(bvec{len(g)}({', '.join(g)}))" for g in groups]
    return conjunction(parts)


def params(rank: int) -> str:
    """The parameter list of a function of one element of a rank-`rank` tensor."""
    return ", ".join(f"int i{k}" for k in range(rank))


def index_args(rank: int) -> list[str]:
    """The index names (i0, i1, ...) of a rank-`rank` element function."""
    return [f"i{k}" for k in range(rank)]


def strides(shape: tuple[int, ...]) -> list[int]:
    """Row-major element strides of `shape`."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return list(reversed(out))


def flat(args: list[str], shape: tuple[int, ...]) -> str:
    """The row-major flat index of the element at `args` of `shape` (size-1 axes dropped)."""
    terms = [a if st == 1 else f"{a} * {st}" for a, st, s in zip(args, strides(shape), shape) if s != 1]
    return " + ".join(terms) or "0"
