"""2-D max and average pooling (NCHW) and their input gradients.

max_pool2d pads with -inf and its gradient goes to the first maximum of each window in
row-major order, as torch does; avg_pool2d counts padding in the divisor (torch's default).
"""

from __future__ import annotations

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.ops._samples import st
from glcomp.ir.ops.conv import conv_out_hw, scatter_windows, windows
from glcomp.ir.ops.registry import Op, register

POOL_ATTRS = ("kernel", "stride", "padding")


def pool_shape(x, kernel, stride, padding):
    if len(x) != 4:
        raise GlcompError(f"pooling expects input of shape (N, C, H, W), got {x}")
    if any(2 * p > k for p, k in zip(padding, kernel, strict=True)):
        raise GlcompError(f"pool padding {padding} must be at most half the kernel {kernel}")
    return (x[0], x[1], *conv_out_hw(x[2:], kernel, stride, padding))


def _pool_case(draw):
    kernel = (draw(st().integers(1, 3)), draw(st().integers(1, 3)))
    stride = (draw(st().integers(1, 3)), draw(st().integers(1, 3)))
    padding = tuple(draw(st().integers(0, k // 2)) for k in kernel)
    n, c = draw(st().integers(1, 2)), draw(st().integers(1, 3))
    h = draw(st().integers(max(1, kernel[0] - 2 * padding[0]), 7))
    w = draw(st().integers(max(1, kernel[1] - 2 * padding[1]), 7))
    return (n, c, h, w), {"kernel": kernel, "stride": stride, "padding": padding}


def sample_pool(draw):
    x, attrs = _pool_case(draw)
    return [x], attrs


def sample_pool_grad(draw, with_input: bool):
    x, attrs = _pool_case(draw)
    y = pool_shape(x, **attrs)
    return ([x, y] if with_input else [y]), attrs | ({} if with_input else {"input_hw": x[2:]})


# -- max -------------------------------------------------------------------------------------------
def max_pool_ref(x, kernel, stride, padding):
    return windows(x, kernel, stride, padding, fill=-np.inf).max(axis=(4, 5)).astype(x.dtype)


def max_pool_grad_ref(x, g, kernel, stride, padding):
    cols = windows(x, kernel, stride, padding, fill=-np.inf)
    n, c, oh, ow, kh, kw = cols.shape
    first = cols.reshape(n, c, oh, ow, kh * kw).argmax(axis=-1)
    onehot = np.eye(kh * kw, dtype=g.dtype)[first].reshape(cols.shape)
    return scatter_windows(onehot * g[..., None, None], x.shape[2:], stride, padding)


def max_pool_grad(g, out, x, kernel, stride, padding):
    from glcomp.ir.tensor import prim

    return (prim("max_pool2d_grad", x, g, kernel=kernel, stride=stride, padding=padding),)


def max_pool_grad_shape(x, g, kernel, stride, padding):
    if pool_shape(x, kernel, stride, padding) != tuple(g):
        raise GlcompError(f"max_pool2d_grad: gradient {g} does not match input {x}")
    return tuple(x)


register(
    Op(
        "max_pool2d",
        "pool",
        pool_shape,
        max_pool_ref,
        max_pool_grad,
        sample=sample_pool,
        smooth=False,
        attrs=POOL_ATTRS,
    )
)
register(
    Op(
        "max_pool2d_grad",
        "pool",
        max_pool_grad_shape,
        max_pool_grad_ref,
        None,  # second derivatives through max pooling are not supported
        2,
        sample=lambda draw: sample_pool_grad(draw, True),
        smooth=False,
        attrs=POOL_ATTRS,
    )
)


# -- average ---------------------------------------------------------------------------------------
def avg_pool_ref(x, kernel, stride, padding):
    return windows(x, kernel, stride, padding).mean(axis=(4, 5)).astype(x.dtype)


def avg_pool_grad_shape(g, kernel, stride, padding, input_hw):
    x = (g[0], g[1], *input_hw)
    if pool_shape(x, kernel, stride, padding) != tuple(g):
        raise GlcompError(f"avg_pool2d_grad: gradient {g} does not match input size {input_hw}")
    return x


def avg_pool_grad_ref(g, kernel, stride, padding, input_hw):
    scale = 1.0 / (kernel[0] * kernel[1])
    cols = np.broadcast_to((g * scale)[..., None, None], g.shape + tuple(kernel))
    return scatter_windows(np.ascontiguousarray(cols), input_hw, stride, padding).astype(g.dtype)


def avg_pool_grad(g, out, x, kernel, stride, padding):
    from glcomp.ir.tensor import prim

    attrs = {"kernel": kernel, "stride": stride, "padding": padding}
    return (prim("avg_pool2d_grad", g, input_hw=x.shape[2:], **attrs),)


def avg_pool_grad_grad(u, out, g, kernel, stride, padding, input_hw):
    from glcomp.ir.tensor import prim

    return (prim("avg_pool2d", u, kernel=kernel, stride=stride, padding=padding),)


register(
    Op(
        "avg_pool2d",
        "pool",
        pool_shape,
        avg_pool_ref,
        avg_pool_grad,
        sample=sample_pool,
        attrs=POOL_ATTRS,
    )
)
register(
    Op(
        "avg_pool2d_grad",
        "pool",
        avg_pool_grad_shape,
        avg_pool_grad_ref,
        avg_pool_grad_grad,
        sample=lambda draw: sample_pool_grad(draw, False),
        attrs=(*POOL_ATTRS, "input_hw"),
    )
)
