"""Names of the tensors of a program's graphs, for the inspector (``rt.inspect(name)``).

A tensor of an entry point's graph can be named (see docs/inspect.md):
- ``%N``: node N, as ``Program.explain(dump_after=...)`` and the graph printer number it;
- ``<path>``: the output of the model part at ``path``, the part ``explain`` lists under "from"
  (``"0"`` for ``0 (Linear)``): the last node that part computes for a later part to read;
- an output of the entry: ``loss``, ``output``, ``grad:<param>`` (a parameter's gradient; in
  ``train_step`` too, where the optimizer consumes it).
States (parameters, buffers, optimizer state) are named by their own names and read from their
textures, so they are not graph tensors here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from glcomp.errors import GlcompError, near_names
from glcomp.ir.graph import Graph

INSPECT_PREFIX = "inspect:"  # the entry output that keeps an inspected tensor


def _part(origin: str) -> str | None:
    """The model part of a forward node's origin (``"0.conv (Conv2d)"`` -> ``"0.conv"``)."""
    if not origin or "[grad]" in origin:
        return None
    return origin.split(" (", 1)[0] or None


def tensor_nodes(graph: Graph, grads: Mapping[str, int] | None = None) -> dict[str, int]:
    """Every name of a tensor of `graph` (see the module docstring) -> its node. `grads`:
    ``grad:<param>`` -> node of the gradients graph, whose node ids the train step shares."""
    names: dict[str, int] = {}
    order = graph.topo()
    outputs = set(graph.outputs.values())
    last: dict[str, int] = {}
    for n in order:
        node = graph.node(n)
        if node["op"] in ("input", "const"):
            continue
        names[f"%{n}"] = n
        part = _part(node["origin"])
        read_elsewhere = any(graph.node(u)["origin"] != node["origin"] for u in graph.users(n))
        if part is not None and (read_elsewhere or n in outputs):
            last[part] = n
    names |= last
    for key, n in (grads or {}).items():
        if n in graph.g and key.startswith("grad:"):
            names[key] = n
    for key, n in graph.outputs.items():
        if graph.node(n)["op"] not in ("input", "const"):
            names[key] = n
    return names


def program_tensor_nodes(graphs: Mapping[str, Graph]) -> dict[str, dict[str, int]]:
    """`tensor_nodes` of each entry point's graph (``train_step`` knows the parameters'
    gradients through the ``gradients`` graph, whose node ids it shares)."""
    grads = {}
    if "gradients" in graphs:
        g = graphs["gradients"]
        grads = {k: n for k, n in g.outputs.items() if k.startswith("grad:")}
    out = {}
    for entry, graph in graphs.items():
        share = {}
        if entry != "gradients":
            # the same node id in both graphs is the same gradient only if it computes the same
            for k, n in grads.items():
                if n in graph.g and graph.node(n)["op"] == graphs["gradients"].node(n)["op"]:
                    share[k] = n
        out[entry] = tensor_nodes(graph, share)
    return out


def keep_for_inspect(graph: Graph, nodes: Mapping[str, int], names: Iterable[str]) -> Graph:
    """A copy of `graph` with an output ``inspect:<name>`` for each of `names` it computes.

    Guarantees: every node of `graph` keeps its operands and its readers but for nodes read by
    two or more nodes already, which get one reader more (the fusion passes store such a node
    either way); so the kernels computing the entry's own outputs are those it had without
    inspection, and the training is unchanged bit for bit. A tensor read once (fused into its
    reader, or run as the epilogue of a loop kernel) is computed a second time: its chain of
    such nodes is copied, back to inputs, constants and nodes with several readers, and the copy
    is the output. A name that already is an output (``loss``, ``grad:*``) gets none."""
    g = graph.copy()
    copies: dict[int, int] = {}

    def shared(n: int) -> bool:
        return graph.node(n)["op"] in ("input", "const") or len(graph.users(n)) >= 2

    def copy_of(root: int) -> int:
        stack = [root]  # iterative: chains of single-reader nodes can be long (unrolled loops)
        while stack:
            n = stack[-1]
            todo = [o for o in graph.operands(n) if not shared(o) and o not in copies]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            if n in copies:
                continue
            data = graph.node(n)
            new = g._next
            g._next += 1
            g.g.add_node(new, **{**data, "attrs": dict(data["attrs"])})
            for index, src in enumerate(graph.operands(n)):
                g.g.add_edge(src if shared(src) else copies[src], new, index=index)
            copies[n] = new
        return copies[root]

    for name in names:
        if name in nodes and name not in graph.outputs:
            n = nodes[name]
            g.outputs[INSPECT_PREFIX + name] = n if shared(n) or n in graph.outputs.values() else copy_of(n)
    return g


def check_inspect_names(
    graphs: Mapping[str, Graph], names: Iterable[str], states: Iterable[str]
) -> dict[str, dict[str, int]]:
    """`program_tensor_nodes` of `graphs`, after checking that each of `names` names a tensor of
    some entry point or a state: GlcompError listing near matches otherwise."""
    nodes = program_tensor_nodes(graphs)
    states = set(states)
    known = set(states).union(*(n.keys() for n in nodes.values()))
    for name in names:
        if name not in known:
            raise GlcompError(f"inspect: no tensor named {name!r} in the program ({near_names(name, known)})")
    return nodes
