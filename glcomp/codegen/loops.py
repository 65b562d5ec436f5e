"""The loop model: how many loop iterations a fragment-shader invocation of a kernel runs.

Mesa's llvmpipe (the software rasterizer the tests and many headless machines run) keeps one loop
limiter per invocation, shared by all loops, and silently leaves every loop once it has counted
65535 iterations (LP_MAX_TGSI_LOOP_ITERATIONS): a kernel past it returns partial sums. Every
back-edge counts, outer loops included. The planner (fusion, MRT) and the renderer (unrolling)
keep every kernel within `FRAGMENT_LOOP_BUDGET` by this model; each loop op's template loop is
described by its lowering's `loop_extent` and `loop_reads` (glcomp.codegen.families).
"""

from __future__ import annotations

from glcomp.codegen.families import is_fused, lowering
from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op

# Loop iterations one invocation may run in all, over every loop of the shader (a margin below
# the software rasterizers' 65535).
FRAGMENT_LOOP_BUDGET = 65_000
MAX_UNROLL = 16  # loop bodies repeated per iteration, at most, to fit a kernel in the budget


def loop_trips(extent: int, limit: int, unroll: int = 1) -> tuple[int, int]:
    """How `_loops.j2` runs a loop of `extent` indices under a per-loop `limit` with its body
    repeated `unroll` times per iteration: (iterations the loops take, body executions)."""
    if extent <= limit and unroll == 1:
        return extent, extent
    inner = -(-min(extent, limit) // unroll)
    outer = -(-extent // (inner * unroll))
    return (inner if outer == 1 else outer + outer * inner), outer * inner * unroll


def fragment_iterations(graph: Graph, roots: list[int], leaves: set[int], limit: int, unroll: int = 1) -> int:
    """Loop iterations one invocation of a kernel with these `roots` runs, counted as the loop
    limiter of a software rasterizer counts them: every root is evaluated once per channel of its
    texel (4 times), and a fused node is recomputed at every read. `leaves` are the values the
    kernel samples (no work); `limit` is the target's per-loop limit and `unroll` the body
    repetition of the rendered loops. Guarantee: never less than what the rendered shader runs."""
    memo: dict[int, int] = {}
    return sum(4 * _calls(graph, r, leaves, limit, unroll, memo) for r in roots)


def _calls(graph: Graph, n: int, leaves: set[int], limit: int, unroll: int, memo: dict[int, int]) -> int:
    """Loop iterations one evaluation of node `n` runs (see `fragment_iterations`), remembered in
    `memo` (a function of the module, not a closure: a recursive closure is a reference cycle
    that only the cyclic garbage collector frees)."""
    if n in memo:  # only nodes that are neither leaves nor sources are remembered
        return memo[n]
    if n in leaves or get_op(graph.op(n)).kind == "source":
        return 0
    ops = graph.operands(n)
    if is_fused(graph, n):
        total = sum(_calls(graph, o, leaves, limit, unroll, memo) for o in ops)
    else:
        low = lowering(graph.op(n))
        if low is None or low.loop_extent is None:
            raise GlcompError(f"no loop model for op {graph.op(n)!r} (node %{n})")
        shapes = [graph.shape(o) for o in ops]
        trips, runs = loop_trips(low.loop_extent(shapes, graph.attrs(n)), limit, unroll)
        if low.loop_reads is None:
            per_run = sum(_calls(graph, o, leaves, limit, unroll, memo) for o in ops)
        else:  # an inner loop per iteration (max pooling's argmax), operands read several times
            inner, reads = low.loop_reads(shapes, graph.attrs(n))
            per_run = inner + sum(
                k * _calls(graph, o, leaves, limit, unroll, memo) for k, o in zip(reads, ops, strict=True)
            )
        total = trips + runs * per_run
    memo[n] = total
    return total
