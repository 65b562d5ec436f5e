"""isolate_states: every written-back state gets a node of its own.

A state's new texture is written while its old one may still be read (ping-pong), and two states
cannot share one texture: so a state output that is an input texture (a parameter returned as it
is) or the same node as another output is replaced by an identity copy (``stop_gradient``).

Guarantees: after this pass the state outputs are distinct nodes, none of them fed (an input);
values are unchanged. A plan whose states are isolated already is returned as it is (its graph
not copied). Not switchable: the bundle needs it.
"""

from __future__ import annotations

from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.ir.ops import get_op
from glcomp.ir.tensor import Tensor


def isolate_states(plan: KernelPlan) -> KernelPlan:
    """Give every written-back state a node of its own: a state's new texture must not be an
    input texture or shared with another output (identity copies are inserted where needed).
    A plan whose states are isolated already is returned as it is."""
    g = plan.graph
    states = [n for key, n in g.outputs.items() if key.partition(":")[0] in ("param", "buffer", "state")]
    if len(set(states)) == len(states) and not any(get_op(g.op(n)).feed for n in states):
        return plan
    g = g.copy()
    seen: set[int] = set()
    for key, n in list(g.outputs.items()):
        if key.partition(":")[0] not in ("param", "buffer", "state"):
            continue
        if get_op(g.op(n)).feed or n in seen:
            g.outputs[key] = Tensor(g, n).detach().node
        seen.add(g.outputs[key])
    return plan.replace(graph=g)
