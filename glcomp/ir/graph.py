"""The IR: a dataflow graph of primitive ops on a networkx MultiDiGraph.

Nodes are integers (creation order). Each node carries `op`, `shape`, `dtype`, `attrs` and
`origin` (the model part that created it, e.g. ``"2 (Linear)"``). An edge ``u -> v`` carries
``index``, the operand position of ``u`` in ``v``, so operand order survives (and ``x * x``
is two parallel edges). Graph inputs are nodes of op ``input`` with a name and a role;
outputs are a name -> node map.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import networkx as nx

from glcomp.errors import GlcompError
from glcomp.ir.ops.registry import get_op

# Roles of graph inputs: what the runtime feeds them with.
ROLES = ("data", "target", "param", "buffer", "state", "hyper")

_ORIGIN: contextvars.ContextVar[str] = contextvars.ContextVar("glcomp_origin", default="")


def current_origin() -> str:
    return _ORIGIN.get()


@contextlib.contextmanager
def origin(label: str) -> Iterator[None]:
    """Nodes created inside this block record `label` as the model part they came from."""
    token = _ORIGIN.set(label)
    try:
        yield
    finally:
        _ORIGIN.reset(token)


def _freeze(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


class Graph:
    """A typed dataflow graph; see the module docstring for the node and edge attributes."""

    def __init__(self) -> None:
        self.g = nx.MultiDiGraph()
        self.inputs: dict[str, int] = {}
        self.outputs: dict[str, int] = {}
        self._next = 0

    # -- construction -------------------------------------------------------------------------
    def add(self, op: str, operands: list[int] | tuple[int, ...] = (), **attrs: Any) -> int:
        """Add a node, infer its shape with the op's shape rule and return its id."""
        rule = get_op(op)
        if rule.arity is not None and len(operands) != rule.arity:
            raise GlcompError(f"op {op!r} takes {rule.arity} operands, got {len(operands)}")
        attrs = {k: _freeze(v) for k, v in attrs.items()}
        dtype = attrs.pop("dtype", None) or self._dtype(operands)
        shapes = [self.shape(o) for o in operands]
        try:
            shape = tuple(int(d) for d in rule.shape(*shapes, **attrs))
        except GlcompError as err:
            where = current_origin()
            raise GlcompError(f"{where}: {err}" if where else str(err)) from None
        node = self._next
        self._next += 1
        self.g.add_node(node, op=op, shape=shape, dtype=dtype, attrs=attrs, origin=current_origin())
        for index, src in enumerate(operands):
            self.g.add_edge(src, node, index=index)
        return node

    def add_input(self, name: str, shape: tuple[int, ...], role: str, dtype: str = "float32") -> int:
        if role not in ROLES:
            raise ValueError(f"unknown input role {role!r}")
        if name in self.inputs:
            raise GlcompError(f"input {name!r} declared twice")
        node = self.add("input", (), shape=tuple(shape), name=name, role=role, dtype=dtype)
        self.inputs[name] = node
        return node

    def _dtype(self, operands: list[int] | tuple[int, ...]) -> str:
        return "float32"

    # -- queries ------------------------------------------------------------------------------
    def node(self, n: int) -> dict[str, Any]:
        return self.g.nodes[n]

    def op(self, n: int) -> str:
        return self.g.nodes[n]["op"]

    def shape(self, n: int) -> tuple[int, ...]:
        return self.g.nodes[n]["shape"]

    def attrs(self, n: int) -> dict[str, Any]:
        return self.g.nodes[n]["attrs"]

    def operands(self, n: int) -> list[int]:
        edges = sorted(self.g.in_edges(n, data="index"), key=lambda e: e[2])
        return [src for src, _, _ in edges]

    def users(self, n: int) -> list[int]:
        return sorted({dst for _, dst in self.g.out_edges(n)})

    def topo(self) -> list[int]:
        """Nodes in a deterministic topological order (ties broken by node id)."""
        return list(nx.lexicographical_topological_sort(self.g))

    def nodes(self) -> list[int]:
        return sorted(self.g.nodes)

    def inputs_with_role(self, role: str) -> dict[str, int]:
        return {k: v for k, v in self.inputs.items() if self.attrs(v)["role"] == role}

    def copy(self) -> Graph:
        new = Graph()
        new.g = self.g.copy()
        for _, data in new.g.nodes(data=True):  # attrs dicts too, so edits to a copy stay local
            data["attrs"] = dict(data["attrs"])
        new.inputs = dict(self.inputs)
        new.outputs = dict(self.outputs)
        new._next = self._next
        return new

    # -- maintenance --------------------------------------------------------------------------
    def prune(self) -> Graph:
        """Return a copy without nodes that no output depends on (inputs are always kept)."""
        keep: set[int] = set(self.inputs.values())
        for out in self.outputs.values():
            keep |= nx.ancestors(self.g, out) | {out}
        new = self.copy()
        new.g.remove_nodes_from([n for n in self.g.nodes if n not in keep])
        return new

    def validate(self) -> None:
        """Check the written contract of a well-formed graph; raise GlcompError if broken.

        Guarantees checked: acyclic; every node's op is registered; operand indices are 0..k-1
        and match the op's arity; every shape equals what the op's shape rule infers from the
        operands; inputs are `input` nodes with a known role; outputs name existing nodes.
        """
        from glcomp.ir.printer import format_node

        if not nx.is_directed_acyclic_graph(self.g):
            raise GlcompError("graph has a cycle")
        for n in self.g.nodes:
            data = self.g.nodes[n]
            try:
                rule = get_op(data["op"])
            except KeyError:
                raise GlcompError(f"unregistered op {data['op']!r} at node %{n}") from None
            idx = sorted(i for _, _, i in self.g.in_edges(n, data="index"))
            if idx != list(range(len(idx))):
                raise GlcompError(f"bad operand indices {idx} at {format_node(self, n)}")
            if rule.arity is not None and len(idx) != rule.arity:
                raise GlcompError(f"wrong operand count at {format_node(self, n)}")
            if data["op"] != "input":
                shapes = [self.shape(o) for o in self.operands(n)]
                want = tuple(rule.shape(*shapes, **data["attrs"]))
                if want != data["shape"]:
                    raise GlcompError(f"shape {data['shape']} != inferred {want} at {format_node(self, n)}")
        for name, n in self.inputs.items():
            if n not in self.g or self.op(n) != "input" or self.attrs(n)["name"] != name:
                raise GlcompError(f"input {name!r} is not an input node")
        for name, n in self.outputs.items():
            if n not in self.g:
                raise GlcompError(f"output {name!r} refers to a missing node {n}")

    def __str__(self) -> str:
        from glcomp.ir.printer import format_graph

        return format_graph(self)

    def __repr__(self) -> str:
        return f"<Graph {self.g.number_of_nodes()} nodes, outputs {list(self.outputs)}>"
