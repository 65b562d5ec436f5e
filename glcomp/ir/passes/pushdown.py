"""Push transposes towards the leaves so sums of matrix products become plain sums.

Rules, applied until none matches (each only where the inner node has no other reader, so no
work is duplicated):
    permute(matmul(a, b), (1, 0))  ->  matmul(permute(b), permute(a))     ((AB)^T = B^T A^T)
    permute(add(a, b), p)          ->  add(permute(a, p), permute(b, p))
    permute(permute(x, p), q)      ->  permute(x, p o q), or x when that is the identity
A permute on a matmul operand costs nothing (the matmul kernel reads through it), so after this
pass a weight gradient summed over time steps is a sum of matmul results in the weight's own
layout, which the code generator can accumulate with additive blending.
"""

from __future__ import annotations

from glcomp.ir.graph import Graph, origin


def _single_reader(graph: Graph, n: int) -> bool:
    return graph.read_count(n) == 1 and n not in graph.outputs.values()


def _rewrite(graph: Graph, n: int) -> bool:
    if graph.op(n) != "permute":
        return False
    perm = graph.attrs(n)["perm"]
    (src,) = graph.operands(n)
    if not _single_reader(graph, src):
        return False
    with origin(graph.node(n)["origin"]):
        if graph.op(src) == "matmul" and perm == (1, 0):
            a, b = graph.operands(src)
            new = graph.add(
                "matmul", [graph.add("permute", [b], perm=(1, 0)), graph.add("permute", [a], perm=(1, 0))]
            )
        elif graph.op(src) == "add":
            a, b = graph.operands(src)
            new = graph.add(
                "add", [graph.add("permute", [a], perm=perm), graph.add("permute", [b], perm=perm)]
            )
        elif graph.op(src) == "permute":
            (x,) = graph.operands(src)
            inner = graph.attrs(src)["perm"]
            composed = tuple(inner[p] for p in perm)
            new = x if composed == tuple(range(len(perm))) else graph.add("permute", [x], perm=composed)
        else:
            return False
    graph.replace_uses(n, new)
    return True


def pushdown(graph: Graph) -> Graph:
    """After this pass no permute reads a single-reader matmul, add or permute.

    Requires a valid graph; the result computes the same outputs (checked by the property
    tests) and is pruned of the nodes the rewrites left unread.
    """
    g = graph.copy()
    changed = True
    while changed:
        changed = False
        for n in g.topo():
            if n in g.g and _rewrite(g, n):
                changed = True
                g = g.prune()
                break
    return g
