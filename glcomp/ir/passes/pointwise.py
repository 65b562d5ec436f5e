"""Pointwise (1x1) convolutions as matrix products.

A 1x1 convolution at stride 1 without padding is a product over channels at every pixel:
with X = x's channels as rows of pixels (C, N*H*W) and W2 = the weight as (O, C),

    conv2d(x, w)                  = P^-1(W2 @ X)            (O, N*H*W) -> (N, O, H, W)
    conv2d_input_grad(g, w)       = P^-1(W2.T @ G)          G = g as (O, N*H*W)
    conv2d_weight_grad(x, g)      = reshape(G @ X.T, w's shape)

where P views (N, C, H, W) as (C, N*H*W) (a reshape, a permute of the two leading axes, a
reshape: each keeps H*W on the packed axis, so the texels are x's when H*W is a multiple of 4).
The products are then register-blocked like any other (a product reads 4 input channels of the
weight a texel, where the convolution's blocked kernel fetched a texel for each weight of a 1x1
kernel); the views of x and g are computed once for every product that reads them.

Guarantee: the same values up to the order of additions (each output is the same sum of
products over channels, or over pixels for the weight gradient). Only ungrouped 1x1 stride-1
unpadded convolutions with H*W a multiple of 4 and an unsplit weight gradient are rewritten; a
graph with none is returned as it is (not copied).
"""

from __future__ import annotations

from glcomp.ir.graph import Graph, origin

OPS = ("conv2d", "conv2d_input_grad", "conv2d_weight_grad")


def _pointwise(graph: Graph, n: int) -> bool:
    op, attrs = graph.op(n), graph.attrs(n)
    if op not in OPS or attrs.get("groups", 1) != 1 or attrs.get("parts", 1) != 1:
        return False
    if tuple(attrs["stride"]) != (1, 1) or tuple(attrs["padding"]) != (0, 0):
        return False
    if op == "conv2d_weight_grad":
        x, _ = graph.operands(n)
        if tuple(attrs["kernel_hw"]) != (1, 1):
            return False
    else:
        x, w = graph.operands(n)
        if graph.shape(w)[2:] != (1, 1):
            return False
    _, _, h, wd = graph.shape(x)
    return (h * wd) % 4 == 0


def _rows(graph: Graph, v: int, cache: dict[int, int]) -> int:
    """(N, C, H, W) `v` viewed as (C, N * H * W), once per value."""
    if v not in cache:
        n, c, h, w = graph.shape(v)
        flat = graph.add("reshape", [v], shape=(n, c, h * w))
        lead = graph.add("permute", [flat], perm=(1, 0, 2))
        cache[v] = graph.add("reshape", [lead], shape=(c, n * h * w))
    return cache[v]


def _images(graph: Graph, rows: int, n: int, hw: tuple[int, int]) -> int:
    """A (C, N * H * W) product back as (N, C, H, W)."""
    c = graph.shape(rows)[0]
    split = graph.add("reshape", [rows], shape=(c, n, hw[0] * hw[1]))
    lead = graph.add("permute", [split], perm=(1, 0, 2))
    return graph.add("reshape", [lead], shape=(n, c, *hw))


def pointwise(graph: Graph) -> Graph:
    """Every ungrouped 1x1 stride-1 unpadded convolution, input gradient and (unsplit) weight
    gradient with H * W a multiple of 4 as a matmul between views (module docstring); the
    graph is pruned of the nodes replaced."""
    todo = [n for n in graph.topo() if _pointwise(graph, n)]
    if not todo:
        return graph
    g = graph.copy()
    rows: dict[int, int] = {}
    weights: dict[int, int] = {}
    for n in todo:
        op = g.op(n)
        with origin(g.node(n)["origin"]):
            if op == "conv2d_weight_grad":
                x, gy = g.operands(n)
                product = g.add(
                    "matmul", [_rows(g, gy, rows), g.add("permute", [_rows(g, x, rows)], perm=(1, 0))]
                )
                new = g.add("reshape", [product], shape=g.shape(n))
            else:
                src, w = g.operands(n)
                if w not in weights:
                    weights[w] = g.add("reshape", [w], shape=g.shape(w)[:2])
                w2 = weights[w] if op == "conv2d" else g.add("permute", [weights[w]], perm=(1, 0))
                product = g.add("matmul", [w2, _rows(g, src, rows)])
                new = _images(g, product, g.shape(n)[0], g.shape(n)[2:])
        g.replace_uses(n, new)
    g.prune_in_place()
    return g
