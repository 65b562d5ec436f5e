"""Split long convolution weight gradients over batch chunks, so their loops run in parallel.

A convolution's weight gradient ``conv2d_weight_grad(x[N,C,H,W], g[N,O,OH,OW])`` has few outputs
(O*C*KH*KW) and a long reduction (N*OH*OW terms each): a fragment shader computes one output
texel per fragment, so a few hundred fragments each loop over the whole batch, and a large GPU
sits almost idle. This pass computes S partial weight gradients over contiguous batch chunks
(each reads ``x[n0:n1]`` and ``g[n0:n1]``, views of the same stored textures) and adds them:

    conv2d_weight_grad(x, g)  ->  wg(x[0:n1], g[0:n1]) + wg(x[n1:n2], g[n1:n2]) + ...

S times as many fragments run loops S times shorter. The sum of the partials is an add tree: the
code generator fuses it into its reader (an optimizer update reads the S partials, one of them
computed inline as the update's epilogue), or, where the sum is a value of its own and the
target blends float render targets, the partials render into one texture with additive
blending (the blend pass), so no summing draw runs at all.

The parts of one split are tagged (node field ``"parallel"``: the id of the weight gradient they
replace) so that MRT fusion keeps them in separate draws: merging them would serialise in one
fragment the loops the split spread over many.
"""

from __future__ import annotations

import math

from glcomp.ir.graph import Graph, origin

LONG = 2048  # weight gradients whose reduction (N*OH*OW) is at least this long are split...
FEW = 16384  # ...when they have at most this many outputs (O*C*KH*KW)...
CHUNK = 1024  # ...into parts reducing about this many terms each...
MAX_PARTS = 8  # ...but at most this many parts (each one is a draw) and at most one per image.


def parts(batch: int, extent: int) -> int:
    """How many batch chunks a weight gradient over `batch` images and `extent` reduced terms is
    split into: ceil(extent / CHUNK), at most MAX_PARTS and at most `batch`."""
    return max(1, min(MAX_PARTS, batch, -(-extent // CHUNK)))


def chunks(batch: int, count: int) -> list[tuple[int, int]]:
    """`count` contiguous [start, stop) ranges covering range(batch), sizes differing by at most
    one (the larger ones first)."""
    size, extra = divmod(batch, count)
    out, start = [], 0
    for k in range(count):
        stop = start + size + (k < extra)
        out.append((start, stop))
        start = stop
    return out


def _batch_slice(graph: Graph, n: int, start: int, stop: int) -> int:
    shape = graph.shape(n)
    return graph.add("slice", [n], starts=(start, *(0,) * (len(shape) - 1)), stops=(stop, *shape[1:]))


def _count(graph: Graph, n: int) -> int:
    """How many parts weight gradient `n` is split into (below 2: it is left alone)."""
    x, g = graph.operands(n)
    extent = graph.shape(g)[0] * graph.shape(g)[2] * graph.shape(g)[3]
    if extent < LONG or math.prod(graph.shape(n)) > FEW:
        return 0
    return parts(graph.shape(x)[0], extent)


def _split(graph: Graph, n: int) -> int | None:
    count = _count(graph, n)
    if count < 2:
        return None
    x, g = graph.operands(n)
    attrs = graph.attrs(n)
    terms = []
    with origin(graph.node(n)["origin"]):
        for start, stop in chunks(graph.shape(x)[0], count):
            xs, gs = _batch_slice(graph, x, start, stop), _batch_slice(graph, g, start, stop)
            part = graph.add("conv2d_weight_grad", [xs, gs], **attrs)
            graph.node(part)["parallel"] = n
            terms.append(part)
        while len(terms) > 1:  # a balanced add tree: rounding error grows with its depth
            pairs = [graph.add("add", terms[k : k + 2]) for k in range(0, len(terms) - 1, 2)]
            terms = pairs + terms[len(terms) - len(terms) % 2 :]
    return terms[0]


def split_weight_grads(graph: Graph) -> Graph:
    """After this pass no ``conv2d_weight_grad`` reduces `LONG` or more terms into at most `FEW`
    outputs over a batch of two or more images: each is replaced by `parts` partial weight
    gradients over contiguous batch `chunks` and a balanced add tree of them.

    Requires a valid graph; the result computes the same outputs up to the order of additions
    and is pruned of the nodes it replaced. Every part carries ``"parallel"``: the replaced id.
    A graph with nothing to split is returned as it is (not copied).
    """
    if not any(graph.op(n) == "conv2d_weight_grad" and _count(graph, n) >= 2 for n in graph.g):
        return graph
    out = graph.copy()
    for n in out.topo():
        if out.op(n) == "conv2d_weight_grad":
            new = _split(out, n)
            if new is not None:
                out.replace_uses(n, new)
    out.prune_in_place()
    return out


def parallel_group(graph: Graph, n: int) -> int | None:
    """The id of the weight gradient that `n` is a part of (see `split_weight_grads`), or None."""
    return graph.node(n).get("parallel")
