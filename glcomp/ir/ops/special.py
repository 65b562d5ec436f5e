"""Special functions as elementwise primitives (one node each, exact gradient rules).

``erf``: the reference is math.erf (correctly rounded); the shader uses Numerical Recipes' erfc
approximation ``t * exp(-x^2 + P(t))``, t = 1 / (1 + |x| / 2), relative error below 1.2e-7 for
every x (``glc_erf`` in the prelude), so the GL result is within float32 rounding of the reference.
"""

from __future__ import annotations

import math

import numpy as np

from glcomp.ir.ops._samples import same_shapes
from glcomp.ir.ops.elementwise import same_shape
from glcomp.ir.ops.registry import Op, register

_erf = np.frompyfunc(math.erf, 1, 1)


def erf_ref(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return np.asarray(_erf(a.astype(np.float64)), dtype=np.float64).astype(a.dtype)


def _erf_grad(g, out, a):
    return (g * (a * a * -1.0).exp() * (2.0 / math.sqrt(math.pi)),)


register(Op("erf", "elementwise", same_shape, erf_ref, _erf_grad, 1, "glc_erf(a)", same_shapes(1)))
