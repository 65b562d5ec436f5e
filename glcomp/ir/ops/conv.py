"""2-D convolution (NCHW, OIHW weights) and its two adjoints, grouped or not.

conv2d, conv2d_input_grad and conv2d_weight_grad are each linear in both operands, and the
gradient of each is written with the other two, so the family is closed under differentiation.

``groups`` (an attribute, 1 when absent) splits the channels into G groups: output channel o reads
the C / G input channels of its group o // (O / G) only, and the weight is (O, C / G, KH, KW), as in
torch. A depthwise convolution is groups = C: one primitive (one kernel) for every group.
conv2d_weight_grad's ``parts`` (1 when absent) stacks partial gradients over consecutive chunks of
its reduction (see `part_rows`) along the output channels, for the code generator's split of long
weight gradients; they sum to the gradient.
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


def _groups(groups: int, *channels: int) -> int:
    if not isinstance(groups, int) or groups < 1 or any(c % groups for c in channels):
        raise GlcompError(f"groups={groups!r} does not divide the channel counts {channels}")
    return groups


def _group_kw(groups: int) -> dict[str, int]:
    """The ``groups`` attribute of a derived primitive: absent when 1 (the ungrouped form)."""
    return {"groups": groups} if groups != 1 else {}


def grouped(a: np.ndarray, axis: int, groups: int) -> np.ndarray:
    """`a` with its `axis` split into (groups, size / groups)."""
    shape = a.shape
    return a.reshape(*shape[:axis], groups, shape[axis] // groups, *shape[axis + 1 :])


# -- conv2d ----------------------------------------------------------------------------------------
def conv2d_shape(x, w, stride, padding, groups=1):
    if len(x) != 4:
        raise GlcompError(f"conv2d expects input of shape (N, C, H, W), got {x}")
    if len(w) != 4 or w[1] * _groups(groups, x[1], w[0]) != x[1]:
        raise GlcompError(f"conv2d weight {w} does not match input {x} (channels {x[1]}, groups {groups})")
    oh, ow = conv_out_hw(x[2:], w[2:], stride, padding)
    return (x[0], w[0], oh, ow)


def conv2d_ref(x, w, stride, padding, groups=1):
    cols = grouped(windows(x, w.shape[2:], stride, padding), 1, groups)  # n g c h w i j
    out = np.einsum("ngchwij,gocij->ngohw", cols, grouped(w, 0, groups))
    return out.reshape(out.shape[0], -1, *out.shape[3:]).astype(x.dtype)


def conv2d_grad(g, out, x, w, stride, padding, groups=1):
    from glcomp.ir.tensor import prim

    kw = _group_kw(groups)
    gx = prim("conv2d_input_grad", g, w, stride=stride, padding=padding, input_hw=x.shape[2:], **kw)
    gw = prim("conv2d_weight_grad", x, g, stride=stride, padding=padding, kernel_hw=w.shape[2:], **kw)
    return gx, gw


def _conv_case(draw):
    groups = draw(st().sampled_from([1, 1, 2, 3]))
    n = draw(st().integers(1, 3))
    c, o = (groups * draw(st().integers(1, 2)) for _ in range(2))
    kh, kw = draw(st().integers(1, 3)), draw(st().integers(1, 3))
    stride = (draw(st().integers(1, 2)), draw(st().integers(1, 2)))
    padding = (draw(st().integers(0, 1)), draw(st().integers(0, 1)))
    h = draw(st().integers(max(1, kh - 2 * padding[0]), 6))
    w = draw(st().integers(max(1, kw - 2 * padding[1]), 6))
    oh, ow = conv_out_hw((h, w), (kh, kw), stride, padding)
    attrs = {"stride": stride, "padding": padding, "groups": groups}
    return (n, c, h, w), (o, c // groups, kh, kw), (n, o, oh, ow), attrs


def sample_conv2d(draw):
    x, w, _, attrs = _conv_case(draw)
    return [x, w], attrs


register(
    Op(
        "conv2d",
        "conv",
        conv2d_shape,
        conv2d_ref,
        conv2d_grad,
        2,
        sample=sample_conv2d,
        attrs=("stride", "padding", "groups"),
        rereads=True,
    )
)


# -- conv2d_input_grad: adjoint in x ---------------------------------------------------------------
def input_grad_shape(g, w, stride, padding, input_hw, groups=1):
    if len(g) != 4 or len(w) != 4 or g[1] != w[0] or w[0] % _groups(groups, w[0]):
        raise GlcompError(f"conv2d_input_grad: gradient {g} does not match weight {w} (groups {groups})")
    if conv_out_hw(input_hw, w[2:], stride, padding) != tuple(g[2:]):
        raise GlcompError(f"conv2d_input_grad: gradient {g} does not match input size {input_hw}")
    return (g[0], w[1] * groups, *input_hw)


def input_grad_ref(g, w, stride, padding, input_hw, groups=1):
    cols = np.einsum("ngohw,gocij->ngchwij", grouped(g, 1, groups), grouped(w, 0, groups))
    cols = cols.reshape(cols.shape[0], -1, *cols.shape[3:])
    return scatter_windows(cols, input_hw, stride, padding).astype(g.dtype)


def input_grad_grad(u, out, g, w, stride, padding, input_hw, groups=1):
    from glcomp.ir.tensor import prim

    kw = _group_kw(groups)
    gg = prim("conv2d", u, w, stride=stride, padding=padding, **kw)
    gw = prim("conv2d_weight_grad", u, g, stride=stride, padding=padding, kernel_hw=w.shape[2:], **kw)
    return gg, gw


def sample_input_grad(draw):
    x, w, y, attrs = _conv_case(draw)
    return [y, w], attrs | {"input_hw": x[2:]}


register(
    Op(
        "conv2d_input_grad",
        "conv",
        input_grad_shape,
        input_grad_ref,
        input_grad_grad,
        2,
        sample=sample_input_grad,
        attrs=("stride", "padding", "input_hw", "groups"),
        rereads=True,
    )
)


# -- conv2d_weight_grad: adjoint in w --------------------------------------------------------------
def part_rows(rows: int, parts: int) -> int:
    """Rows (image, output row) pairs of a weight gradient's reduction per part: part s reduces
    rows [s * L, min((s + 1) * L, rows)) of the N * OH rows, L = ceil(rows / parts)."""
    return -(-rows // parts)


def weight_grad_shape(x, g, stride, padding, kernel_hw, groups=1, parts=1):
    if len(x) != 4 or len(g) != 4 or x[0] != g[0]:
        raise GlcompError(f"conv2d_weight_grad: input {x} does not match gradient {g}")
    _groups(groups, x[1], g[1])
    if conv_out_hw(x[2:], kernel_hw, stride, padding) != tuple(g[2:]):
        raise GlcompError(f"conv2d_weight_grad: gradient {g} does not match input {x}")
    if not isinstance(parts, int) or not 1 <= parts <= g[0] * g[2]:
        raise GlcompError(f"conv2d_weight_grad: parts={parts!r} must be between 1 and N * OH = {g[0] * g[2]}")
    return (parts * g[1], x[1] // groups, *kernel_hw)


def weight_grad_ref(x, g, stride, padding, kernel_hw, groups=1, parts=1):
    cols = grouped(windows(x, kernel_hw, stride, padding), 1, groups)
    gg = grouped(g, 1, groups)
    if parts == 1:
        out = np.einsum("ngchwij,ngohw->gocij", cols, gg)
        return out.reshape(-1, *out.shape[2:]).astype(x.dtype)
    n, oh = g.shape[0], g.shape[2]
    rows = part_rows(n * oh, parts)
    row = np.arange(n)[:, None] * oh + np.arange(oh)[None, :]  # (n, oh): the reduction row
    outs = []
    for s in range(parts):
        keep = ((row >= s * rows) & (row < (s + 1) * rows)).astype(g.dtype)[:, None, None, :, None]
        out = np.einsum("ngchwij,ngohw->gocij", cols, gg * keep)
        outs.append(out.reshape(-1, *out.shape[2:]))
    return np.concatenate(outs).astype(x.dtype)


def weight_grad_grad(u, out, x, g, stride, padding, kernel_hw, groups=1, parts=1):
    from glcomp.ir.tensor import prim

    kw = _group_kw(groups)
    if parts != 1:
        return _parts_grad(u, x, g, stride, padding, kw, parts)
    gx = prim("conv2d_input_grad", g, u, stride=stride, padding=padding, input_hw=x.shape[2:], **kw)
    gg = prim("conv2d", x, u, stride=stride, padding=padding, **kw)
    return gx, gg


def _parts_grad(u, x, g, stride, padding, kw, parts):
    """The gradient of stacked partial weight gradients: part s is the weight gradient of g
    masked to its rows (image, output row), so each part's cotangent u_s reaches x through that
    masked g and g through its rows only."""
    from glcomp.ir.tensor import const, prim, reshape

    n, o, oh = g.shape[0], g.shape[1], g.shape[2]
    rows = part_rows(n * oh, parts)
    gx = gg = None
    for s in range(parts):
        start, stop = s * rows, min((s + 1) * rows, n * oh)
        if start >= stop:
            continue
        ones = const(g.graph, 1.0, (stop - start,))
        mask = reshape(prim("pad", ones, before=(start,), after=(n * oh - stop,)), (n, 1, oh, 1))
        us = u[s * o : (s + 1) * o]
        hw = x.shape[2:]
        px = prim("conv2d_input_grad", g * mask, us, stride=stride, padding=padding, input_hw=hw, **kw)
        pg = prim("conv2d", x, us, stride=stride, padding=padding, **kw) * mask
        gx, gg = (px, pg) if gx is None else (gx + px, gg + pg)
    return gx, gg


def sample_weight_grad(draw):
    x, w, y, attrs = _conv_case(draw)
    parts = draw(st().integers(1, min(3, y[0] * y[2])))
    return [x, y], attrs | {"kernel_hw": w[2:], "parts": parts}


register(
    Op(
        "conv2d_weight_grad",
        "conv",
        weight_grad_shape,
        weight_grad_ref,
        weight_grad_grad,
        2,
        sample=sample_weight_grad,
        attrs=("stride", "padding", "kernel_hw", "groups", "parts"),
        rereads=True,
    )
)
