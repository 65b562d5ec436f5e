"""Elementwise primitives: operands of one shape (the tracer inserts `expand` to broadcast).

Each op's `glsl` is one expression over the operand values a, b; helpers such as glc_tanh come
from the shared shader prelude (with vec4 overloads). Kernels evaluate fused chains a texel at a
time, so an op whose `glsl` is not valid on vec4 operands gives the vec4 form in `glsl4`.
Transcendentals and division cost 2 (simple ops 1) when the planner weighs recomputing a fused
operand.
"""

from __future__ import annotations

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.ops._samples import same_shapes
from glcomp.ir.ops.registry import Op, register


def same_shape(*shapes: tuple[int, ...], **_: object) -> tuple[int, ...]:
    for s in shapes[1:]:
        if s != shapes[0]:
            raise GlcompError(f"elementwise operands have different shapes {shapes[0]} and {s}")
    return shapes[0]


def _t():  # the Tensor API, imported late: it builds nodes through this registry
    from glcomp.ir import tensor

    return tensor


def _unary(name, ref, grad, glsl, **kw):
    register(Op(name, "elementwise", same_shape, ref, grad, 1, glsl, same_shapes(1), **kw))


def _binary(name, ref, grad, glsl, **kw):
    register(Op(name, "elementwise", same_shape, ref, grad, 2, glsl, same_shapes(2), **kw))


def _step(x):
    return (x > 0).astype(x.dtype)


# -- unary ---------------------------------------------------------------------------------------
_unary("neg", np.negative, lambda g, out, a: (-g,), "-a")
_unary("exp", np.exp, lambda g, out, a: (g * out,), "glc_exp(a)", cost=2)
_unary("log", np.log, lambda g, out, a: (g / a,), "log(a)", domain="positive", cost=2)
_unary("sqrt", np.sqrt, lambda g, out, a: (g * 0.5 / out,), "sqrt(a)", domain="positive", cost=2)
_unary("tanh", np.tanh, lambda g, out, a: (g * (1.0 - out * out),), "glc_tanh(a)", cost=2)
_unary(
    "sigmoid",
    lambda a: 1.0 / (1.0 + np.exp(-a)),
    lambda g, out, a: (g * out * (1.0 - out),),
    "1.0 / (1.0 + glc_exp(-a))",
    cost=2,
)
_unary(
    "relu",
    lambda a: np.maximum(a, 0).astype(a.dtype),
    lambda g, out, a: (g * _t().unary("step", a),),
    "glc_max(a, 0.0)",
    smooth=False,
    glsl4="glc_max(a, vec4(0.0))",
)
# step and eq are masks for gradient rules; they have zero derivative almost everywhere.
_unary(
    "step",
    _step,
    lambda g, out, a: (None,),
    "(a > 0.0 ? 1.0 : 0.0)",
    smooth=False,
    glsl4="vec4(greaterThan(a, vec4(0.0)))",
)
_unary("stop_gradient", lambda a: a.copy(), lambda g, out, a: (None,), "a")

# -- binary --------------------------------------------------------------------------------------
_binary("add", np.add, lambda g, out, a, b: (g, g), "a + b", blend_add=True)
_binary("sub", np.subtract, lambda g, out, a, b: (g, -g), "a - b")
_binary("mul", np.multiply, lambda g, out, a, b: (g * b, g * a), "a * b")
_binary("div", np.divide, lambda g, out, a, b: (g / b, -g * out / b), "a / b", domain="nonzero", cost=2)


def _maximum_grad(g, out, a, b):
    mask = _t().unary("step", a - b)  # ties send the gradient to b
    return g * mask, g * (1.0 - mask)


_binary("maximum", np.maximum, _maximum_grad, "glc_max(a, b)", smooth=False)
_binary(
    "eq",
    lambda a, b: (a == b).astype(a.dtype),
    lambda g, out, a, b: (None, None),
    "(a == b ? 1.0 : 0.0)",
    smooth=False,
    glsl4="vec4(equal(a, b))",
)


# -- ternary -------------------------------------------------------------------------------------
def _where_grad(g, out, cond, a, b):
    zero = _t().zeros_like(g)
    return None, _t().where(cond, g, zero), _t().where(cond, zero, g)


# where(cond, a, b): a where cond != 0 (a NaN condition counts as true, as in numpy), else b.
register(
    Op(
        "where",
        "elementwise",
        same_shape,
        lambda c, a, b: np.where(c != 0, a, b).astype(a.dtype),
        _where_grad,
        3,
        "(a != 0.0 ? b : c)",
        same_shapes(3),
        glsl4="vec4(a.x != 0.0 ? b.x : c.x, a.y != 0.0 ? b.y : c.y, "
        "a.z != 0.0 ? b.z : c.z, a.w != 0.0 ? b.w : c.w)",
    )
)
