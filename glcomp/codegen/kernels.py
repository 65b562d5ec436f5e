"""Kernels: what the kernel-forming passes (fusion, epilogue, texture_units) share.

Every op that needs a loop of its own (matmul, conv, pool, reduce) roots a kernel. Elementwise,
movement and index ops are fused into the kernel that reads them: they become small GLSL
functions the reader calls per element, so a permute before a matmul or a bias add after it costs
no draw call. A fused value is recomputed where it is read. Which values are stored (and why, one
of the reasons below) is decided by the passes; `form_kernels` then gives every stored value the
kernel computing it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from glcomp.codegen.families import template_of
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op

if TYPE_CHECKING:
    from glcomp.codegen.kernel_plan import KernelPlan

FUSIBLE = ("elementwise", "movement", "index")


def fed(graph: Graph, n: int) -> bool:
    """A graph input: a texture or uniform the runtime feeds."""
    return get_op(graph.op(n)).feed


def constant(graph: Graph, n: int) -> bool:
    """A source written into the shader: never stored, never sampled."""
    rule = get_op(graph.op(n))
    return rule.kind == "source" and not rule.feed


@dataclass(frozen=True)
class Kernel:
    """One draw call's worth of work: `roots` are written (one render target each), `body` are
    the fused nodes computed on the way (topological order), `leaves` the textures read.
    Kernels are values: passes build new ones and never change the lists of one they were given."""

    name: str
    roots: list[int]
    body: list[int]
    leaves: list[int]
    template: str
    origins: list[str] = field(default_factory=list)


# Why a value is stored (KernelPlan.stored): the first reason that applies, in this order
# (fusion chooses all but TEXTURE_UNITS, which the texture_units pass adds).
INPUT, OUTPUT, STATE, LOOP, MULTI_READER, LOOP_OPERAND, UNFUSED, TEXTURE_UNITS = (
    "input",
    "output",
    "state",
    "loop",
    "multi-reader",
    "loop-operand",
    "unfused",
    "texture-units",
)


def fused_region(
    graph: Graph, root: int, stored: Collection[int], index: NodeIndex | None = None
) -> tuple[list[int], list[int]]:
    """Nodes computed inside root's kernel and the stored leaves it reads."""
    index = index or NodeIndex(graph)
    body: set[int] = set()
    leaves: set[int] = set()
    stack = list(index.operands[root])
    feeds = index.feeds
    while stack:
        n = stack.pop()
        if n in stored or n in feeds:  # hyper-parameters are uniforms, still leaves
            leaves.add(n)
        elif n not in body:
            body.add(n)
            stack.extend(index.operands[n])
    return sorted(body, key=index.position.__getitem__), sorted(leaves)


class NodeIndex:
    """Each node's operands and position in graph.topo(), computed once per plan (or taken
    from `order` and `operands` when the caller has them)."""

    def __init__(
        self,
        graph: Graph,
        order: list[int] | None = None,
        operands: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        self.topo = graph.topo() if order is None else order
        self.position = {n: i for i, n in enumerate(self.topo)}
        self.operands = operands if operands is not None else {n: graph.operands(n) for n in self.topo}
        self.feeds = {n for n in self.topo if get_op(graph.op(n)).feed}  # see `fed`


def form_kernels(graph: Graph, stored: Collection[int], index: NodeIndex) -> list[Kernel]:
    """One kernel per stored non-input node, in topological order: the node as its root, the
    fused nodes it computes as its body and the stored values it reads as its leaves."""
    kernels: list[Kernel] = []
    for n in index.topo:
        if n not in stored or n in index.feeds:
            continue
        body, leaves = fused_region(graph, n, stored, index)
        template = template_of(graph.op(n))
        origins = sorted({graph.node(m)["origin"] for m in [*body, n] if graph.node(m)["origin"]})
        kernels.append(Kernel(f"k{len(kernels)}_{graph.op(n)}", [n], body, leaves, template, origins))
    return kernels


def index_of(plan: KernelPlan) -> NodeIndex:
    """The NodeIndex of a plan after the layout pass (its order and operands, not recomputed)."""
    return NodeIndex(plan.graph, list(plan.order), plan.operands)


def with_kernels(plan: KernelPlan, stored: dict[int, str]) -> KernelPlan:
    """`plan` with `stored` as its stored values and the kernels that compute them."""
    return plan.replace(stored=stored, kernels=form_kernels(plan.graph, stored, index_of(plan)))
