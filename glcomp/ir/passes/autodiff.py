"""Reverse-mode automatic differentiation as a graph rewrite."""

from __future__ import annotations

import networkx as nx

from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph, origin
from glcomp.ir.ops import get_op
from glcomp.ir.tensor import Tensor, const, zeros_like


def autodiff(graph: Graph, loss: str, wrt: list[str]) -> Graph:
    """After this pass the graph has an output ``grad:<name>`` for every input name in `wrt`.

    Guarantees: gradients are built from registry ops only (so they can be differentiated again
    and rendered as kernels); contributions at fan-out are summed; un-broadcasting is done by the
    `expand` rule; only nodes on a path from a `wrt` input to the loss get backward work, so data
    inputs and frozen parameters cost nothing. Backward nodes carry their forward node's origin
    with a ``[grad]`` suffix. Requires: `loss` names a scalar output.
    """
    g = graph.copy()
    if loss not in g.outputs:
        raise GlcompError(f"autodiff: no output named {loss!r}")
    loss_node = g.outputs[loss]
    if g.shape(loss_node) != ():
        raise GlcompError(f"autodiff: loss must be a scalar, got shape {g.shape(loss_node)}")
    sources = []
    for name in wrt:
        if name not in g.inputs:
            raise GlcompError(f"autodiff: no input named {name!r}")
        sources.append(g.inputs[name])

    reaches_loss = nx.ancestors(g.g, loss_node) | {loss_node}
    from_sources: set[int] = set()
    for s in sources:
        from_sources |= nx.descendants(g.g, s) | {s}
    active = reaches_loss & from_sources

    grads: dict[int, Tensor] = {}
    with origin(g.node(loss_node)["origin"]):
        grads[loss_node] = const(g, 1.0)
    for n in reversed(graph.topo()):  # only forward nodes: the copy gains backward nodes
        if n not in active or n not in grads or g.op(n) == "input":
            continue
        rule = get_op(g.op(n))
        where = g.node(n)["origin"]
        if rule.grad is None:
            raise GlcompError(f"{where or 'graph'}: no gradient rule for op {g.op(n)!r} (node %{n})")
        operands = g.operands(n)
        with origin(f"{where} [grad]" if where else "[grad]"):
            parts = rule.grad(grads[n], Tensor(g, n), *(Tensor(g, o) for o in operands), **g.attrs(n))
            if len(parts) != len(operands):
                raise GlcompError(f"gradient rule of {g.op(n)!r} returned {len(parts)} parts")
            for src, part in zip(operands, parts, strict=True):
                if part is None or src not in active:
                    continue
                if part.shape != g.shape(src):
                    raise GlcompError(
                        f"gradient rule of {g.op(n)!r} gave shape {part.shape} for an operand "
                        f"of shape {g.shape(src)}"
                    )
                grads[src] = grads[src] + part if src in grads else part

    for name, s in zip(wrt, sources, strict=True):
        if s not in grads:  # the loss does not depend on it: a zero gradient, as torch reports 0
            with origin(g.node(s)["origin"]):
                grads[s] = zeros_like(Tensor(g, s))
        g.outputs[f"grad:{name}"] = grads[s].node
    return g
