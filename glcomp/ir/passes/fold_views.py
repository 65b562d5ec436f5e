"""Fold chains of views: a transpose of a transpose, a reshape of a reshape, identity views.

Autodiff writes the gradient of ``x @ W.T`` with respect to ``x`` as ``g @ (W.T).T``: a permute
of a permute. Kernels read views through fused functions, so such a chain costs nothing to
store, but it hides that the operand is ``W`` itself, a stored texture the matmul kernel could
read a texel at a time. Rules, applied bottom-up until none matches:

    permute(permute(x, p), q)  ->  permute(x, p o q), or x when that is the identity
    reshape(reshape(x, s), t)  ->  reshape(x, t), or x when t is x's shape
    permute(x, identity), reshape(x, x.shape)  ->  x
    permute(bmm(a, b), swap of the last two axes)  ->  bmm(permute(b), permute(a))
        when the product has no other reader and a or b is itself such a transpose, which
        then folds away

The last rule is autodiff's too: the gradient of ``q @ k.T`` with respect to ``k`` is written
``(q.T @ g).T``, whose reader sees a transpose of a product (read an element at a time, never a
stored texture a Linear's weight gradient can read by rows); ``g.T @ q`` is the same products,
summed over the same K, with the transpose moved onto an operand. The number of transposed
operands does not grow (one of the two cancels). 2-D products are left as they are: a Linear's
weight gradient ``(x.T @ g).T`` is read transposed by its update, a form the kernels read as
well as the other.
"""

from __future__ import annotations

from glcomp.ir.graph import Graph, origin


def _swaps_last(graph: Graph, n: int) -> bool:
    """Whether `n` is a permute that swaps the last two axes only (a batch of transposes)."""
    if graph.op(n) != "permute":
        return False
    perm = tuple(graph.attrs(n)["perm"])
    r = len(perm)
    return r >= 2 and perm == (*range(r - 2), r - 1, r - 2)


def _product_transpose(graph: Graph, n: int) -> bool:
    """Whether `n` is the transpose of a product that the last rule moves onto its operands."""
    if not _swaps_last(graph, n):
        return False
    (src,) = graph.operands(n)
    if graph.op(src) != "bmm":
        return False
    if graph.read_count(src) != 1 or src in set(graph.outputs.values()):
        return False
    return any(_swaps_last(graph, o) for o in graph.operands(src))


def _foldable(graph: Graph, n: int) -> bool:
    """Whether `_fold` rewrites `n` (without changing the graph)."""
    op = graph.op(n)
    if op not in ("permute", "reshape"):
        return False
    (src,) = graph.operands(n)
    if op == "permute":
        perm = tuple(graph.attrs(n)["perm"])
        return perm == tuple(range(len(perm))) or graph.op(src) == "permute" or _product_transpose(graph, n)
    return tuple(graph.attrs(n)["shape"]) == graph.shape(src) or graph.op(src) == "reshape"


def _fold(graph: Graph, n: int) -> int | None:
    op = graph.op(n)
    if op not in ("permute", "reshape"):
        return None
    (src,) = graph.operands(n)
    if op == "permute":
        perm = tuple(graph.attrs(n)["perm"])
        if perm == tuple(range(len(perm))):
            return src
        if _product_transpose(graph, n):
            a, b = graph.operands(src)
            with origin(graph.node(n)["origin"]):
                bt = graph.add("permute", [b], perm=perm)
                at = graph.add("permute", [a], perm=perm)
                return graph.add(graph.op(src), [bt, at])
        if graph.op(src) != "permute":
            return None
        (x,) = graph.operands(src)
        inner = tuple(graph.attrs(src)["perm"])
        composed = tuple(inner[p] for p in perm)
        if composed == tuple(range(len(composed))):
            return x
        with origin(graph.node(n)["origin"]):
            return graph.add("permute", [x], perm=composed)
    shape = tuple(graph.attrs(n)["shape"])
    if shape == graph.shape(src):
        return src
    if graph.op(src) != "reshape":
        return None
    (x,) = graph.operands(src)
    if graph.shape(x) == shape:
        return x
    with origin(graph.node(n)["origin"]):
        return graph.add("reshape", [x], shape=shape)


def fold_views(graph: Graph) -> Graph:
    """After this pass no permute reads a permute, no reshape reads a reshape, no permute or
    reshape is the identity (graph outputs keep their own node only if it is not such a view),
    and no transpose reads a product of its own that has a transposed operand.

    Requires a valid graph; the result computes the same outputs (views move values, they never
    change them; a product and the transposed product of transposes multiply the same pairs and
    sum them over K in the same order) and is pruned of the views it bypassed. A graph with nothing to fold or
    prune is returned as it is (not copied).
    """
    if not any(_foldable(graph, n) for n in graph.g) and len(graph.live()) == len(graph.g):
        return graph
    g = graph.copy()
    changed = True
    while changed:
        changed = False
        outputs = set(g.outputs.values())
        for n in g.topo():
            if g.read_count(n) == 0 and n not in outputs:
                continue  # already bypassed, waiting to be pruned
            new = _fold(g, n)
            if new is not None and new != n:
                g.replace_uses(n, new)
                changed = True
    g.prune_in_place()
    return g
