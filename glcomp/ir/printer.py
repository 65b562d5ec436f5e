"""Text form of the IR, one node per line in the style of a jaxpr:

%7:f32[64,10] = add %5 %6            # 2 (Linear)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from glcomp.ir.graph import Graph

_SHORT = {"float32": "f32", "float64": "f64", "int32": "i32"}


def _attr(value: object) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return "(" + ",".join(_attr(v) for v in value) + ")"
    return str(value)


def format_node(graph: Graph, n: int) -> str:
    d = graph.node(n)
    dims = ",".join(str(s) for s in d["shape"])
    attrs = d["attrs"]
    head = f"%{n}:{_SHORT.get(d['dtype'], d['dtype'])}[{dims}] = {d['op']}"
    if attrs:
        head += "[" + " ".join(f"{k}={_attr(attrs[k])}" for k in sorted(attrs)) + "]"
    args = " ".join(f"%{o}" for o in graph.operands(n))
    line = f"{head} {args}".rstrip()
    return f"{line:<60} # {d['origin']}" if d["origin"] else line


def format_graph(graph: Graph) -> str:
    lines = [format_node(graph, n) for n in graph.topo()]
    outs = ", ".join(f"{k}=%{v}" for k, v in graph.outputs.items())
    lines.append(f"return {outs}")
    return "\n".join(lines)
