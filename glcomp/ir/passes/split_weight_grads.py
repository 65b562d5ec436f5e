"""Split long convolution weight gradients into partial sums computed side by side in one draw.

A convolution's weight gradient ``conv2d_weight_grad(x[N,C,H,W], g[N,O,OH,OW])`` has few outputs
(O*C*KH*KW) and a long reduction (N*OH*OW terms each): a fragment shader computes one output
texel per fragment, so a few thousand fragments each loop over the whole batch, and a large GPU
sits almost idle. This pass computes P partial gradients, each over consecutive (image, output
row) pairs of the reduction, as one primitive (``parts=P``: the partials stacked along the output
channels, one draw with P times the fragments and loops P times shorter), and sums them:

    conv2d_weight_grad(x, g)  ->  sum(reshape(conv2d_weight_grad(x, g, parts=P), (P, O, C, KH, KW)), 0)

The sum reads P values per weight; the code generator fuses it into its reader (an optimizer
update). Which gradients are split depends on the layer, not on the batch: a gradient is split
when one image contributes at least `PER_IMAGE` terms (OH*OW) and it has at most `FEW` outputs,
so a bundle has the same draws at every batch size; only P grows with the batch (about `CHUNK`
terms per part, at most `MAX_PARTS` parts).
"""

from __future__ import annotations

import math

from glcomp.ir.graph import Graph, origin

PER_IMAGE = 64  # weight gradients whose reduction has at least this many terms per image (OH*OW)...
FEW = 1 << 18  # ...and at most this many outputs (O*C*KH*KW) are split...
CHUNK = 1024  # ...into parts reducing about this many terms each...
MAX_PARTS = 32  # ...but at most this many parts (each adds the outputs' size of partials).


def parts(rows: int, extent: int) -> int:
    """How many parts a weight gradient over `rows` (image, output row) pairs and `extent` reduced
    terms is split into: ceil(extent / CHUNK), at least 1, at most MAX_PARTS and `rows`."""
    return max(1, min(MAX_PARTS, rows, -(-extent // CHUNK)))


def _count(graph: Graph, n: int) -> int:
    """How many parts weight gradient `n` is split into (0: it is left alone)."""
    if graph.attrs(n).get("parts", 1) != 1:
        return 0
    g = graph.shape(graph.operands(n)[1])
    if g[2] * g[3] < PER_IMAGE or math.prod(graph.shape(n)) > FEW:
        return 0
    return parts(g[0] * g[2], g[0] * g[2] * g[3])


def _split(graph: Graph, n: int) -> int | None:
    count = _count(graph, n)
    if not count:
        return None
    shape = graph.shape(n)
    with origin(graph.node(n)["origin"]):
        part = graph.add("conv2d_weight_grad", list(graph.operands(n)), **graph.attrs(n), parts=count)
        stacked = graph.add("reshape", [part], shape=(count, *shape))
        total = graph.add("sum", [stacked], axes=(0,))
        return graph.add("reshape", [total], shape=shape)


def split_weight_grads(graph: Graph) -> Graph:
    """After this pass every ``conv2d_weight_grad`` with at least `PER_IMAGE` terms per image and
    at most `FEW` outputs is computed in `parts` partial sums by one primitive and summed.

    Requires a valid graph; the result computes the same outputs up to the order of additions
    and is pruned of the nodes it replaced. A graph with nothing to split is returned as it is
    (not copied).
    """
    if not any(graph.op(n) == "conv2d_weight_grad" and _count(graph, n) for n in graph.g):
        return graph
    out = graph.copy()
    for n in out.topo():
        if out.op(n) == "conv2d_weight_grad":
            new = _split(out, n)
            if new is not None:
                out.replace_uses(n, new)
    out.prune_in_place()
    return out
