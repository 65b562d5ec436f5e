"""2-D convolution (NCHW, OIHW weights) and its two adjoints.

conv2d, conv2d_input_grad and conv2d_weight_grad are each linear in both operands, and the
gradient of each is written with the other two, so the family is closed under differentiation.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from glcomp.errors import GlcompError
from glcomp.ir.ops._samples import st
from glcomp.ir.ops.registry import Op, register


def out_size(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def conv_out_hw(hw, khw, stride, padding) -> tuple[int, int]:
    oh = out_size(hw[0], khw[0], stride[0], padding[0])
    ow = out_size(hw[1], khw[1], stride[1], padding[1])
    if oh < 1 or ow < 1:
        raise GlcompError(
            f"a {khw[0]}x{khw[1]} window with padding {padding} does not fit an input of {hw[0]}x{hw[1]}"
        )
    return oh, ow


def windows(x: np.ndarray, khw, stride, padding, fill: float = 0.0) -> np.ndarray:
    """(N, C, OH, OW, KH, KW) view of the padded input under every window position."""
    ph, pw = padding
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    v = sliding_window_view(xp, khw, axis=(2, 3))
    return v[:, :, :: stride[0], :: stride[1]]


def scatter_windows(cols: np.ndarray, hw, stride, padding) -> np.ndarray:
    """Adjoint of `windows`: add (N, C, OH, OW, KH, KW) values back onto an (N, C, H, W) input."""
    n, c, oh, ow, kh, kw = cols.shape
    ph, pw = padding
    sh, sw = stride
    out = np.zeros((n, c, hw[0] + 2 * ph, hw[1] + 2 * pw), dtype=cols.dtype)
    for i in range(kh):
        for j in range(kw):
            out[:, :, i : i + sh * (oh - 1) + 1 : sh, j : j + sw * (ow - 1) + 1 : sw] += cols[..., i, j]
    return out[:, :, ph : ph + hw[0], pw : pw + hw[1]]


# -- conv2d ----------------------------------------------------------------------------------------
def conv2d_shape(x, w, stride, padding):
    if len(x) != 4:
        raise GlcompError(f"conv2d expects input of shape (N, C, H, W), got {x}")
    if len(w) != 4 or w[1] != x[1]:
        raise GlcompError(f"conv2d weight {w} does not match input {x} (channels {x[1]})")
    oh, ow = conv_out_hw(x[2:], w[2:], stride, padding)
    return (x[0], w[0], oh, ow)


def conv2d_ref(x, w, stride, padding):
    cols = windows(x, w.shape[2:], stride, padding)
    return np.einsum("nchwij,ocij->nohw", cols, w).astype(x.dtype)


def conv2d_grad(g, out, x, w, stride, padding):
    from glcomp.ir.tensor import prim

    gx = prim("conv2d_input_grad", g, w, stride=stride, padding=padding, input_hw=x.shape[2:])
    gw = prim("conv2d_weight_grad", x, g, stride=stride, padding=padding, kernel_hw=w.shape[2:])
    return gx, gw


def _conv_case(draw):
    n, c, o = (draw(st().integers(1, 3)) for _ in range(3))
    kh, kw = draw(st().integers(1, 3)), draw(st().integers(1, 3))
    stride = (draw(st().integers(1, 2)), draw(st().integers(1, 2)))
    padding = (draw(st().integers(0, 1)), draw(st().integers(0, 1)))
    h = draw(st().integers(max(1, kh - 2 * padding[0]), 6))
    w = draw(st().integers(max(1, kw - 2 * padding[1]), 6))
    oh, ow = conv_out_hw((h, w), (kh, kw), stride, padding)
    return (n, c, h, w), (o, c, kh, kw), (n, o, oh, ow), stride, padding


def sample_conv2d(draw):
    x, w, _, stride, padding = _conv_case(draw)
    return [x, w], {"stride": stride, "padding": padding}


register(
    Op(
        "conv2d",
        "conv",
        conv2d_shape,
        conv2d_ref,
        conv2d_grad,
        2,
        sample=sample_conv2d,
        attrs=("stride", "padding"),
        rereads=True,
    )
)


# -- conv2d_input_grad: adjoint in x ---------------------------------------------------------------
def input_grad_shape(g, w, stride, padding, input_hw):
    if len(g) != 4 or len(w) != 4 or g[1] != w[0]:
        raise GlcompError(f"conv2d_input_grad: gradient {g} does not match weight {w}")
    if conv_out_hw(input_hw, w[2:], stride, padding) != tuple(g[2:]):
        raise GlcompError(f"conv2d_input_grad: gradient {g} does not match input size {input_hw}")
    return (g[0], w[1], *input_hw)


def input_grad_ref(g, w, stride, padding, input_hw):
    cols = np.einsum("nohw,ocij->nchwij", g, w)
    return scatter_windows(cols, input_hw, stride, padding).astype(g.dtype)


def input_grad_grad(u, out, g, w, stride, padding, input_hw):
    from glcomp.ir.tensor import prim

    gg = prim("conv2d", u, w, stride=stride, padding=padding)
    gw = prim("conv2d_weight_grad", u, g, stride=stride, padding=padding, kernel_hw=w.shape[2:])
    return gg, gw


def sample_input_grad(draw):
    x, w, y, stride, padding = _conv_case(draw)
    return [y, w], {"stride": stride, "padding": padding, "input_hw": x[2:]}


register(
    Op(
        "conv2d_input_grad",
        "conv",
        input_grad_shape,
        input_grad_ref,
        input_grad_grad,
        2,
        sample=sample_input_grad,
        attrs=("stride", "padding", "input_hw"),
        rereads=True,
    )
)


# -- conv2d_weight_grad: adjoint in w --------------------------------------------------------------
def weight_grad_shape(x, g, stride, padding, kernel_hw):
    if len(x) != 4 or len(g) != 4 or x[0] != g[0]:
        raise GlcompError(f"conv2d_weight_grad: input {x} does not match gradient {g}")
    if conv_out_hw(x[2:], kernel_hw, stride, padding) != tuple(g[2:]):
        raise GlcompError(f"conv2d_weight_grad: gradient {g} does not match input {x}")
    return (g[1], x[1], *kernel_hw)


def weight_grad_ref(x, g, stride, padding, kernel_hw):
    cols = windows(x, kernel_hw, stride, padding)
    return np.einsum("nchwij,nohw->ocij", cols, g).astype(x.dtype)


def weight_grad_grad(u, out, x, g, stride, padding, kernel_hw):
    from glcomp.ir.tensor import prim

    gx = prim("conv2d_input_grad", g, u, stride=stride, padding=padding, input_hw=x.shape[2:])
    gg = prim("conv2d", x, u, stride=stride, padding=padding)
    return gx, gg


def sample_weight_grad(draw):
    x, w, y, stride, padding = _conv_case(draw)
    return [x, y], {"stride": stride, "padding": padding, "kernel_hw": w[2:]}


register(
    Op(
        "conv2d_weight_grad",
        "conv",
        weight_grad_shape,
        weight_grad_ref,
        weight_grad_grad,
        2,
        sample=sample_weight_grad,
        attrs=("stride", "padding", "kernel_hw"),
        rereads=True,
    )
)
