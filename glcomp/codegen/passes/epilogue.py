"""epilogue: a loop kernel runs inside the elementwise kernel that alone reads it.

A stored loop result (not an output) that exactly one stored elementwise value reads, each
element at most once (through elementwise ops and one-to-one views, no broadcast), is no longer
stored: the loop runs inside that kernel, once per element (a matmul with its bias add, or with
the SGD update that consumes it), which saves a draw and a texture.

Guarantees: at most one loop is fused into each epilogue kernel (several make shaders that
software rasterizers compile and run very slowly); the kernels are formed again from the
smaller stored set, with fusion's guarantees. Off with ``passes={"epilogue": False}`` or
``{"fusion": False}``; a plan with nothing to fuse is returned as it is.
"""

from __future__ import annotations

from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.codegen.kernels import with_kernels
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op
from glcomp.ir.ops.registry import LOOP_KINDS


def epilogue(plan: KernelPlan) -> KernelPlan:
    """Run a loop kernel inside the elementwise kernel that alone reads it, once per element."""
    if not (plan.switches["fusion"] and plan.switches["epilogue"]):
        return plan
    kept = set(plan.stored)
    fuse_epilogues(plan.graph, kept, list(plan.order))
    if len(kept) == len(plan.stored):
        return plan
    return with_kernels(plan, {n: why for n, why in plan.stored.items() if n in kept})


def _epilogue_reader(graph: Graph, n: int, stored: set[int]) -> int | None:
    """The stored elementwise value that alone reads loop result `n`, each element at most once
    (through elementwise ops and one-to-one views), or None."""
    while True:
        users = graph.reads_of(n)
        if len(users) != 1:
            return None
        (user,) = users
        rule = get_op(graph.op(user))
        if rule.kind not in ("elementwise", "movement") or rule.broadcast:
            return None  # a broadcast would recompute the loop once per copy
        if user in stored:
            return user
        n = user


def fuse_epilogues(graph: Graph, stored: set[int], order: list[int] | None = None) -> None:
    """Un-store loop results that one elementwise kernel reads once per element: the loop then
    runs inside that kernel (a matmul with its bias add, or with the SGD update that consumes
    it) and saves a draw and a texture. `order` is graph.topo() when the caller has it."""
    outputs = set(graph.outputs.values())
    taken: set[int] = set()
    for n in graph.topo() if order is None else order:
        loop = get_op(graph.op(n)).kind in LOOP_KINDS
        if loop and n in stored and n not in outputs:
            reader = _epilogue_reader(graph, n, stored)
            # One loop per epilogue kernel: several (a sum of per-step products) make a shader
            # that software rasterizers compile and run very slowly.
            if reader is not None and reader not in taken:
                taken.add(reader)
                stored.discard(n)
