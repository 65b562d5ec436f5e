"""layout: the graph is final from here on; its topological order, each node's operands and each
node's texture layout are computed once.

Layouts follow glcomp.codegen.layout's packing rule under the planning target's texture size
(one Layout value per distinct shape). Guarantees: `order` is a topological order of every node,
`operands` and `layouts` cover every node; the graph is not changed. Not switchable.
"""

from __future__ import annotations

from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.codegen.layout import Layout, layout_for


def layout(plan: KernelPlan) -> KernelPlan:
    """The topological order, every node's operands and every node's texture layout."""
    g, size = plan.graph, plan.target.max_texture_size
    order = g.topo()
    by_shape: dict[tuple[int, ...], Layout] = {}  # layouts are values: one per distinct shape
    layouts = {}
    for n in g.nodes():
        shape = g.shape(n)
        if shape not in by_shape:
            by_shape[shape] = layout_for(shape, size)
        layouts[n] = by_shape[shape]
    return plan.replace(
        order=tuple(order), operands={n: tuple(g.operands(n)) for n in order}, layouts=layouts
    )
