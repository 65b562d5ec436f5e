"""Join a sum of products into one product over concatenated operands.

Reverse-mode differentiation sums a gradient's contributions one by one. A weight used at every
step of a recurrence of T steps (an LSTM's recurrent weight) gets one product per step,
``h_0^T g_1 + h_1^T g_2 + ...``: T products with K = N (the batch: too short to use a GPU), each
a draw of its own. This pass rewrites

    a_1 @ b_1 + ... + a_k @ b_k            ->  concat(a_1..a_k, axis=1) @ concat(b_1..b_k, axis=0)
    (a_1 @ b_1)^T + ... + (a_k @ b_k)^T    ->  (concat(a_i, 1) @ concat(b_i, 0))^T

where a concatenation of transposes is written as the transpose of a concatenation
(``concat(x_i^T, 1) = concat(x_i, 0)^T``), so that a weight gradient's ``x^T`` stays a view of one
stored tensor. The products become one with K = sum of the k_i (T * N for the recurrent weight),
which the tiling pass blocks like any long product; the concatenations are copies (split into
gather trees by `split_wide` where they read more textures than a target has).

Only chains of ``add`` nodes of one shape (no broadcasting) whose inner sums nothing else reads
are joined, and only 2-D products (and their transposes) nothing else reads, so no value is
computed twice. Other terms of a chain stay terms of the sum. (Sums of disjoint pads -- the
sequence's input-projection gradient -- are left alone: joined into a concat, the concat is fused
into the product reading it, which then cannot be blocked.) Requires a valid graph; the result
computes the same outputs up to the order of additions and is pruned of the nodes it replaced.
A graph with nothing to join is returned as it is (not copied).
"""

from __future__ import annotations

from glcomp.ir.graph import Graph, origin

MIN_TERMS = 2  # a group of fewer terms is left as it is


def _terms(graph: Graph, root: int) -> list[int]:
    """The terms of the add chain ending at `root`: operands of its adds that are not themselves
    inner adds (adds of the same shape that only this chain reads), in operand order."""
    shape, out, todo = graph.shape(root), [], [root]
    while todo:
        n = todo.pop()
        for src in reversed(graph.operands(n)):
            inner = graph.op(src) == "add" and graph.shape(src) == shape and graph.read_count(src) == 1
            if inner and all(graph.shape(o) == shape for o in graph.operands(src)):
                todo.append(src)
            else:
                out.append(src)
    out.reverse()
    return out


def _chain_roots(graph: Graph) -> list[int]:
    """Adds of same-shaped operands that are not inner adds of a longer chain."""
    roots = []
    for n in graph.topo():
        if graph.op(n) != "add" or any(graph.shape(o) != graph.shape(n) for o in graph.operands(n)):
            continue
        users = graph.users(n)
        inner = (
            graph.read_count(n) == 1
            and graph.op(users[0]) == "add"
            and n not in graph.outputs.values()
            and all(graph.shape(o) == graph.shape(users[0]) for o in graph.operands(users[0]))
            and graph.shape(users[0]) == graph.shape(n)
        )
        if not inner:
            roots.append(n)
    return roots


def _is_transpose(graph: Graph, n: int) -> bool:
    return graph.op(n) == "permute" and tuple(graph.attrs(n)["perm"]) == (1, 0)


def _product(graph: Graph, term: int) -> tuple[int, bool] | None:
    """(matmul, transposed) when `term` is a 2-D product or the transpose of one that only the sum
    reads; else None."""
    transposed = _is_transpose(graph, term)
    mm = graph.operands(term)[0] if transposed else term
    if graph.op(mm) != "matmul" or len(graph.shape(mm)) != 2 or graph.read_count(mm) != 1:
        return None
    if graph.read_count(term) != 1 or any(len(graph.shape(o)) != 2 for o in graph.operands(mm)):
        return None
    return mm, transposed


def _cat(graph: Graph, parts: list[int], axis: int) -> int:
    return parts[0] if len(parts) == 1 else graph.add("concat", parts, axis=axis)


def _join_products(graph: Graph, group: list[tuple[int, bool]]) -> int:
    """One product (transposed when the group's terms are) over the group's operands joined along K."""
    a_parts = [graph.operands(mm)[0] for mm, _ in group]
    b_parts = [graph.operands(mm)[1] for mm, _ in group]
    if all(_is_transpose(graph, a) for a in a_parts):  # concat(x_i^T, 1) == concat(x_i, 0)^T
        a = graph.add("permute", [_cat(graph, [graph.operands(x)[0] for x in a_parts], 0)], perm=(1, 0))
    else:
        a = _cat(graph, a_parts, 1)
    if all(_is_transpose(graph, b) for b in b_parts):  # concat(y_i^T, 0) == concat(y_i, 1)^T
        b = graph.add("permute", [_cat(graph, [graph.operands(y)[0] for y in b_parts], 1)], perm=(1, 0))
    else:
        b = _cat(graph, b_parts, 0)
    mm = graph.add("matmul", [a, b])
    return graph.add("permute", [mm], perm=(1, 0)) if group[0][1] else mm


def _groups(graph: Graph, terms: list[int]) -> tuple[list[list[tuple[int, bool]]], list[int]]:
    """The chain's products grouped by (transposed, shape), and its other terms."""
    products: dict[tuple[bool, tuple[int, ...]], list[tuple[int, bool]]] = {}
    rest: list[int] = []
    for t in terms:
        prod = _product(graph, t)
        if prod is not None:
            products.setdefault((prod[1], graph.shape(prod[0])), []).append(prod)
        else:
            rest.append(t)
    return list(products.values()), rest


def _joins(graph: Graph, root: int) -> bool:
    groups, _ = _groups(graph, _terms(graph, root))
    return any(len(group) >= MIN_TERMS for group in groups)


def _join(graph: Graph, root: int) -> int | None:
    """The chain at `root` with its joinable terms joined, or None when nothing joins."""
    terms = _terms(graph, root)
    products, rest = _groups(graph, terms)
    joined: list[int] = []
    with origin(graph.node(root)["origin"]):
        for group in products:
            if len(group) < MIN_TERMS:
                rest.extend(mm if not transposed else graph.users(mm)[0] for mm, transposed in group)
            else:
                joined.append(_join_products(graph, group))
        if not joined:
            return None
        order = {t: i for i, t in enumerate(terms)}
        total, *more = joined + sorted(rest, key=order.__getitem__)
        for t in more:
            total = graph.add("add", [total, t])
    return total


def join_sums(graph: Graph) -> Graph:
    """After this pass no add chain (see `_terms`) has two products of one shape (or two
    transposed products of one shape) that only it reads: each such group is one product over
    joined operands.

    Requires a valid graph; outputs are the same up to the order of additions. A graph with
    nothing to join is returned as it is.
    """
    out: Graph | None = None
    for root in _chain_roots(graph):
        if not _joins(graph if out is None else out, root):
            continue
        if out is None:
            out = graph.copy()
        new = _join(out, root)
        if new is not None:
            out.replace_uses(root, new)
    if out is None:
        return graph
    out.prune_in_place()
    return out
