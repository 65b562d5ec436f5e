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
import heapq
import math
from collections.abc import Iterator
from typing import Any

import networkx as nx

from glcomp.errors import GlcompError
from glcomp.ir.ops.registry import get_op

# Roles of graph inputs: what the runtime feeds them with.
ROLES = ("data", "target", "param", "buffer", "state", "hyper")
DTYPES = ("float32", "int32", "int64")  # what a saved graph may declare
MAX_ELEMENTS = 1 << 31  # elements of one tensor in a saved graph

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
        return self.g._node[n]

    def op(self, n: int) -> str:
        return self.g._node[n]["op"]

    def shape(self, n: int) -> tuple[int, ...]:
        return self.g._node[n]["shape"]

    def attrs(self, n: int) -> dict[str, Any]:
        return self.g._node[n]["attrs"]

    def operands(self, n: int) -> list[int]:
        """The nodes `n` reads, in operand order (by the ``index`` of its in-edges)."""
        pred = self.g._pred[n]
        if len(pred) == 1:  # one operand node (most nodes): one edge, or several to sort
            for src, keys in pred.items():
                if len(keys) == 1:
                    return [src]
        pairs = [(data["index"], src) for src, keys in pred.items() for data in keys.values()]
        if len(pairs) > 1:
            pairs.sort(key=_first)  # stable: ties keep the in-edge order
        return [src for _, src in pairs]

    def users(self, n: int) -> list[int]:
        return sorted(self.g._succ[n])

    def reads_of(self, n: int) -> list[int]:
        """The node reading each out-edge of `n` (a node reading `n` twice is listed twice), in
        edge order: what ``g.out_edges(n)`` lists, without building a networkx view."""
        return [user for user, keys in self.g._succ[n].items() for _ in keys]

    def read_count(self, n: int) -> int:
        """How many operand slots read `n`: ``g.out_degree(n)``, without a networkx view."""
        return sum(len(keys) for keys in self.g._succ[n].values())

    def topo(self) -> list[int]:
        """Nodes in a deterministic topological order (ties broken by node id): the order
        ``networkx.lexicographical_topological_sort`` gives. Raises GlcompError on a cycle."""
        succ, pred = self.g._succ, self.g._pred
        nodes = sorted(succ)
        if all(u < v for u, users in succ.items() for v in users):
            return nodes  # every edge runs from an older node to a newer one: creation order is topological
        waiting = {v: len(pred[v]) for v in nodes}
        ready = [v for v in nodes if not waiting[v]]  # sorted, so already a heap
        order: list[int] = []
        while ready:
            u = heapq.heappop(ready)
            order.append(u)
            for v in succ[u]:
                waiting[v] -= 1
                if not waiting[v]:
                    heapq.heappush(ready, v)
        if len(order) != len(nodes):
            raise GlcompError("graph has a cycle")
        return order

    def nodes(self) -> list[int]:
        return sorted(self.g.nodes)

    def copy(self) -> Graph:
        """An independent copy: the same nodes, edges (keys included) and attributes, in the same
        iteration order as ``networkx.MultiDiGraph.copy`` gives; node data and attrs dicts and
        edge data dicts are new, so edits to the copy stay local."""
        old = self.g
        g = nx.MultiDiGraph()
        g.graph.update(old.graph)
        nodes = {n: {**data, "attrs": dict(data["attrs"])} for n, data in old._node.items()}
        succ: dict[int, dict[int, dict[Any, dict[str, Any]]]] = {n: {} for n in nodes}
        pred: dict[int, dict[int, dict[Any, dict[str, Any]]]] = {n: {} for n in nodes}
        for u, users in old._succ.items():
            out = succ[u]
            for v, keys in users.items():
                out[v] = pred[v][u] = {key: data.copy() for key, data in keys.items()}
        g._node, g._adj, g._succ, g._pred = nodes, succ, succ, pred
        new = Graph()
        new.g = g
        new.inputs = dict(self.inputs)
        new.outputs = dict(self.outputs)
        new._next = self._next
        return new

    # -- maintenance --------------------------------------------------------------------------
    def replace_uses(self, old: int, new: int) -> None:
        """Point every reader of `old` (and every output naming it) at `new`, in place; `old`
        stays in the graph, unread (`prune` removes it)."""
        for _, user, key, index in list(self.g.out_edges(old, keys=True, data="index")):
            self.g.remove_edge(old, user, key)
            self.g.add_edge(new, user, index=index)
        for name, n in self.outputs.items():
            if n == old:
                self.outputs[name] = new

    def live(self) -> set[int]:
        """The nodes some output depends on, and every input."""
        keep: set[int] = set(self.inputs.values())
        pred = self.g._pred
        stack = [n for n in self.outputs.values() if n not in keep]
        keep.update(stack)
        while stack:  # every ancestor of an output, in one walk
            for src in pred[stack.pop()]:
                if src not in keep:
                    keep.add(src)
                    stack.append(src)
        return keep

    def prune(self) -> Graph:
        """Return a copy without nodes that no output depends on (inputs are always kept)."""
        new = self.copy()
        new.prune_in_place()
        return new

    def prune_in_place(self) -> None:
        """Remove the nodes no output depends on (inputs are always kept), in place."""
        keep = self.live()
        if len(keep) != len(self.g):
            self.g.remove_nodes_from([n for n in self.g.nodes if n not in keep])

    def validate(self) -> None:
        """Check the written contract of a well-formed graph; raise GlcompError if broken.

        Guarantees checked: acyclic; every node's op is registered; operand indices are 0..k-1
        and match the op's arity; every shape equals what the op's shape rule infers from the
        operands; inputs are `input` nodes with a known role; outputs name existing nodes.
        """
        from glcomp.ir.printer import format_node

        self.topo()  # GlcompError("graph has a cycle") unless acyclic
        pred = self.g._pred
        for n, data in self.g._node.items():
            try:
                rule = get_op(data["op"])
            except KeyError:
                raise GlcompError(f"unregistered op {data['op']!r} at node %{n}") from None
            idx = sorted(e["index"] for keys in pred[n].values() for e in keys.values())
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

    # -- serialization --------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The graph as plain JSON data: nodes (id, op, shape, dtype, attrs, origin, operands in
        order), inputs and outputs. `Graph.from_json` rebuilds an identical graph (same node ids,
        so the same evaluation order)."""
        nodes = []
        for n in self.nodes():
            data = self.g.nodes[n]
            nodes.append(
                {
                    "id": n,
                    "op": data["op"],
                    "shape": list(data["shape"]),
                    "dtype": data["dtype"],
                    "attrs": {k: _attr_to_json(v) for k, v in data["attrs"].items()},
                    "origin": data["origin"],
                    "operands": self.operands(n),
                }
            )
        return {
            "nodes": nodes,
            "inputs": dict(self.inputs),
            "outputs": dict(self.outputs),
            "next": self._next,
        }

    @classmethod
    def from_json(cls, data: Any, where: str = "graph") -> Graph:
        """Rebuild a graph from `to_json` data, which is untrusted: every field is type-checked,
        every op must be registered, operands must name earlier nodes, and the result must pass
        `validate` (shapes agree with the ops' shape rules). Faults raise GlcompError starting
        with `where`. Nothing is executed."""

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise GlcompError(f"{where}: {msg}")

        need(isinstance(data, dict), "must be an object")
        need(
            set(data) == {"nodes", "inputs", "outputs", "next"},
            "must have the keys inputs, next, nodes, outputs",
        )
        nodes = data["nodes"]
        need(isinstance(nodes, list), "nodes must be a list")
        g = cls()
        for i, node in enumerate(nodes):
            field = f"nodes[{i}]"
            need(isinstance(node, dict), f"{field} must be an object")
            keys = {"id", "op", "shape", "dtype", "attrs", "origin", "operands"}
            need(set(node) == keys, f"{field} must have exactly the keys {sorted(keys)}")
            n = node["id"]
            need(_is_int(n) and n >= 0 and n not in g.g, f"{field}.id must be a new non-negative integer")
            op = node["op"]
            need(isinstance(op, str), f"{field}.op must be a string")
            try:
                get_op(op)
            except KeyError:
                raise GlcompError(f"{where}: {field} has unknown op {op!r}") from None
            shape = node["shape"]
            need(
                isinstance(shape, list)
                and len(shape) <= 8
                and all(_is_int(s) and 0 <= s <= MAX_ELEMENTS for s in shape)
                and math.prod(shape) <= MAX_ELEMENTS,
                f"{field} ({op}) has a bad shape {shape!r}",
            )
            need(node["dtype"] in DTYPES, f"{field}.dtype must be one of {DTYPES}")
            need(isinstance(node["origin"], str), f"{field}.origin must be a string")
            attrs = node["attrs"]
            need(isinstance(attrs, dict), f"{field}.attrs must be an object")
            operands = node["operands"]
            need(
                isinstance(operands, list) and all(_is_int(o) and o in g.g for o in operands),
                f"{field}.operands must list earlier nodes",
            )
            try:
                frozen = {k: _attr_from_json(v) for k, v in attrs.items()}
            except ValueError as err:
                raise GlcompError(f"{where}: {field}.attrs: {err}") from None
            g.g.add_node(
                n, op=op, shape=tuple(shape), dtype=node["dtype"], attrs=frozen, origin=node["origin"]
            )
            for index, src in enumerate(operands):
                g.g.add_edge(src, n, index=index)
        for key in ("inputs", "outputs"):
            table = data[key]
            need(isinstance(table, dict), f"{key} must be an object")
            for name, n in table.items():
                need(_is_int(n) and n in g.g, f"{key}.{name} must name a node")
        g.inputs = dict(data["inputs"])
        g.outputs = dict(data["outputs"])
        need(_is_int(data["next"]) and data["next"] > max(g.g.nodes, default=-1), "next must exceed every id")
        g._next = data["next"]
        for name, n in g.inputs.items():
            attrs = g.attrs(n)
            need(
                g.op(n) == "input" and attrs.get("name") == name and attrs.get("role") in ROLES,
                f"input {name!r} is not an input node with a known role",
            )
        try:
            g.validate()
        except Exception as err:  # a shape rule fed hostile attributes may fail in any way
            raise GlcompError(f"{where}: {err}") from None
        return g


def _first(pair: tuple[int, int]) -> int:
    return pair[0]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_SPECIAL_FLOATS = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


def _attr_to_json(value: Any) -> Any:
    """Node attribute -> JSON: tuples become lists, non-finite floats ``{"float": "inf"}``."""
    if isinstance(value, tuple | list):
        return [_attr_to_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "item"):  # numpy scalar
        return _attr_to_json(value.item())
    raise GlcompError(f"graph attribute {value!r} of type {type(value).__name__} cannot be saved")


def _attr_from_json(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_attr_from_json(v) for v in value)
    if isinstance(value, dict):
        if set(value) == {"float"} and value["float"] in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[value["float"]]
        raise ValueError(f"unexpected object {value!r}")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise ValueError(f"unexpected value {value!r}")
