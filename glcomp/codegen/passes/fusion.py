"""fusion: which values are stored in textures, and the kernels computing them.

Stored: inputs (not hyper-parameters: those are uniforms), outputs (STATE for written-back
states), loop results (matmul, conv, pool, reduce), elementwise and index values read more than
once (counted through views: a fused value is recomputed at every read, so one reader keeps that
linear), and operands of matmuls and convolutions whose recomputation costs more than
cost.RECOMPUTE (such a kernel reads each operand element many times). Constants and views of
stored values never are. Everything else is fused into the kernels that read it.

Guarantees: every stored non-input node is the root of exactly one kernel, kernels come in
topological order, and each kernel's body is exactly the unstored nodes its root computes from
its leaves. Off (``passes={"fusion": False}``): every computed node is stored (UNFUSED), one
kernel per op, to measure what fusion saves.
"""

from __future__ import annotations

from glcomp.codegen import cost
from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.codegen.kernels import (
    INPUT,
    LOOP,
    LOOP_OPERAND,
    MULTI_READER,
    OUTPUT,
    STATE,
    UNFUSED,
    constant,
    fed,
    with_kernels,
)
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op
from glcomp.ir.ops.registry import LOOP_KINDS


def fusion(plan: KernelPlan) -> KernelPlan:
    """Store inputs, outputs, loop results, values read more than once and costly loop
    operands; fuse everything else into the kernels that read it (off: one kernel per op)."""
    stored = storage_reasons(plan.graph, plan.switches["fusion"], list(plan.order))
    for n in plan.state_out():
        if stored.get(n) == OUTPUT:
            stored[n] = STATE
    return with_kernels(plan, stored)


def _readers_through_views(graph: Graph, n: int, memo: dict[int, int]) -> int:
    """How many non-view nodes read `n`, following chains of movement ops."""
    if n in memo:
        return memo[n]
    count = 0
    for user in graph.reads_of(n):
        if get_op(graph.op(user)).kind == "movement":
            count += _readers_through_views(graph, user, memo)
        else:
            count += 1
    memo[n] = count
    return count


def _recompute_cost(graph: Graph, n: int, stored: set[int]) -> int:
    """Roughly how many ops recomputing fused node `n` costs (the ops' `cost`: transcendentals
    count double, movement nothing)."""
    cost, seen, stack = 0, set(), [n]
    while stack:
        m = stack.pop()
        rule = get_op(graph.op(m))
        if m in seen or m in stored or rule.kind == "source":
            continue
        seen.add(m)
        cost += rule.cost
        stack.extend(graph.operands(m))
    return cost


def storage_reasons(graph: Graph, fusion: bool = True, order: list[int] | None = None) -> dict[int, str]:
    """The nodes whose values are stored in textures, each with the first reason that applies
    (INPUT, OUTPUT, LOOP, MULTI_READER, LOOP_OPERAND, or UNFUSED with `fusion` off), in the order
    the nodes were chosen. `order` is graph.topo() when the caller has it."""
    if not fusion:
        return {
            n: INPUT if fed(graph, n) else UNFUSED
            for n in graph.nodes()
            if not constant(graph, n) and not (fed(graph, n) and graph.attrs(n)["role"] == "hyper")
        }
    order = graph.topo() if order is None else order
    stored: dict[int, str] = {}
    memo: dict[int, int] = {}
    outputs = set(graph.outputs.values())
    for n in order:
        kind = get_op(graph.op(n)).kind
        if fed(graph, n) and graph.attrs(n)["role"] != "hyper":
            stored[n] = INPUT
        elif n in outputs:
            stored[n] = OUTPUT
        elif kind in LOOP_KINDS:
            stored[n] = LOOP
        elif kind in ("elementwise", "index") and _readers_through_views(graph, n, memo) > 1:
            stored[n] = MULTI_READER
    # A matmul or convolution reads each operand element many times; a fused operand would be
    # recomputed at every read, so store operands that are more than a cheap op or two.
    for n in order:
        if get_op(graph.op(n)).rereads:
            for src in graph.operands(n):
                while get_op(graph.op(src)).kind == "movement" and src not in stored:
                    (src,) = graph.operands(src)[:1]
                if src not in stored and _recompute_cost(graph, src, stored.keys()) > cost.RECOMPUTE:
                    stored[src] = LOOP_OPERAND
    return stored
