"""The kernel plan of one entry point: what the code generator has decided so far, as a value.

A `KernelPlan` is frozen: each pass of glcomp.codegen.pipeline (one module each under
glcomp.codegen.passes) takes one and returns a new one (``dataclasses.replace``), never changing
the plan it was given. It holds the IR graph, its topological order (computed once, when the
graph stops changing), the texture layout of every node, the stored values (each with the reason
it is stored), the kernels in execution order, the blend plan (which kernel results are added
into which sum's texture) and the memory plan (which texture slot each temporary takes).
``str(plan)`` prints one line per kernel (before kernels are formed: one line per graph node),
stable enough for golden tests; `check_plan` states the plan's invariants and checks them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from glcomp.codegen.families.conv import ConvTiling, WeightGradTiling
from glcomp.codegen.families.matmul import Tiling
from glcomp.codegen.kernels import Kernel
from glcomp.codegen.layout import Layout, layout_for
from glcomp.codegen.loops import FRAGMENT_LOOP_BUDGET, fragment_iterations
from glcomp.codegen.target import Target
from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op
from glcomp.ir.printer import format_node

Slot = tuple[tuple[int, int], int]  # a texture: (size, index among the textures of that size)


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


def frozen(mapping: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """A read-only view of a private copy of `mapping` (insertion order kept)."""
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class KernelPlan:
    """One entry point's code-generation plan (see the module docstring).

    `stored` maps every value kept in a texture to why (glcomp.codegen.kernels: "input", "output",
    "state", "loop", "multi-reader", "loop-operand", "unfused", "texture-units"); `into` sends a
    kernel result to the texture of the sum it is added into (blending), `blended` names the
    kernels that add rather than overwrite; `memory` gives each temporary one texture slot per
    page. `states` are the names of persistent states (their textures come from the bundle,
    not the memory plan). `storage` is the ``storage=`` option (glcomp.codegen.options.STORAGE;
    with "rgba8", `target` is the planning target, a quarter of the device's texture size).
    `done` names the passes run so far, in order.
    """

    entry: str
    graph: Graph
    target: Target
    switches: Mapping[str, bool]
    states: frozenset[str] = frozenset()
    storage: str = "f32"
    done: tuple[str, ...] = ()
    order: tuple[int, ...] = ()
    operands: Mapping[int, tuple[int, ...]] = field(default_factory=_empty)
    layouts: Mapping[int, Layout] = field(default_factory=_empty)
    stored: Mapping[int, str] = field(default_factory=_empty)
    kernels: tuple[Kernel, ...] = ()
    into: Mapping[int, int] = field(default_factory=_empty)
    blended: frozenset[str] = frozenset()
    memory: Mapping[int, tuple[Slot, ...]] = field(default_factory=_empty)
    tilings: Mapping[str, Tiling | ConvTiling | WeightGradTiling] = field(default_factory=_empty)
    # tiled product -> the name of its tiled kernel, for products read from their tiles by their
    # one reader (which gathers as it reads: the product gets no gather draw and no texture)
    from_tiles: Mapping[int, str] = field(default_factory=_empty)

    @property
    def after(self) -> str:
        """The last pass run ("start" before any)."""
        return self.done[-1] if self.done else "start"

    def replace(self, **changes: Any) -> KernelPlan:
        """A new plan with `changes` (mappings are copied and made read-only)."""
        for key, value in changes.items():
            if isinstance(value, dict):
                changes[key] = frozen(value)
            elif key == "kernels":
                changes[key] = tuple(value)
        return dataclasses.replace(self, **changes)

    # -- facts derived from the graph --------------------------------------------------------
    def state_in(self) -> dict[int, str]:
        """Input node -> state name, for inputs read from persistent state textures."""
        g = self.graph
        return {n: g.attrs(n)["name"] for n in g.inputs.values() if g.attrs(n)["name"] in self.states}

    def state_out(self) -> dict[int, str]:
        """Output node -> state name, for the values written back to persistent state."""
        out = {}
        for key, n in self.graph.outputs.items():
            kind, _, name = key.partition(":")
            if kind in ("param", "buffer", "state"):
                out[n] = name
        return out

    def hypers(self) -> dict[int, str]:
        """Input node -> name, for hyper-parameters (uniforms, no texture)."""
        g = self.graph
        return {n: g.attrs(n)["name"] for n in g.inputs.values() if g.attrs(n)["role"] == "hyper"}

    def data_in(self) -> dict[str, int]:
        """Name -> input node, for the data and target inputs the caller uploads."""
        g = self.graph
        return {g.attrs(n)["name"]: n for n in g.inputs.values() if g.attrs(n)["role"] in ("data", "target")}

    def readback(self) -> dict[str, int]:
        """Output name -> node, for the outputs the caller reads back (not states)."""
        return {
            k: n
            for k, n in self.graph.outputs.items()
            if k.partition(":")[0] not in ("param", "buffer", "state")
        }

    def written(self, kernel: Kernel) -> list[int]:
        """The values whose textures `kernel` renders to (a blended term writes its sum's)."""
        return [self.into.get(r, r) for r in kernel.roots]

    def temporaries(self) -> dict[int, list[tuple[int, int]]]:
        """Stored values that take textures from the memory plan, with each page's size (and the
        tiles of tiled kernels, negative ids)."""
        fixed = set(self.state_in()) | set(self.state_out()) | set(self.hypers())
        lays = self.layouts
        temps = {
            n: [(lays[n].width, lays[n].height)] * lays[n].pages
            for n in self.stored
            if n not in fixed and n not in self.from_tiles
        }
        for t in self.tilings.values():
            lay = t.tile_layout(self.target.max_texture_size)
            temps |= {tile: [(lay.width, lay.height)] for tile in t.tiles}
        return temps

    def steps(self) -> list[tuple[list[int], list[int]]]:
        """(values written, values read) of each draw in order: a tiled kernel draws its tiles
        from its leaves, then its result from the tiles (unless its one reader reads the tiles:
        `from_tiles`)."""
        out: list[tuple[list[int], list[int]]] = []
        for k in self.kernels:
            t = self.tilings.get(k.name)
            reads = self.reads(k)
            if t is None:
                out.append((self.written(k), reads))
            elif k.roots[0] in self.from_tiles:
                out.append((t.tiles, reads))
            else:
                out += [(t.tiles, reads), (self.written(k), t.tiles)]
        return out

    def reads(self, kernel: Kernel) -> list[int]:
        """The textures `kernel` samples: its leaves, each product it reads from its tiles
        (`from_tiles`) as those tiles."""
        out: list[int] = []
        for n in kernel.leaves:
            name = self.from_tiles.get(n)
            out += self.tilings[name].tiles if name is not None else [n]
        return out

    def loop_iterations(self, kernel: Kernel) -> int:
        """Loop iterations one invocation of `kernel` runs (before unrolling; see
        glcomp.codegen.loops.fragment_iterations)."""
        limit = self.target.max_loop_iterations
        return fragment_iterations(self.graph, kernel.roots, set(kernel.leaves), limit)

    # -- printing -------------------------------------------------------------------------------
    def _value(self, n: int) -> str:
        g = self.graph
        if get_op(g.op(n)).feed:
            return f"%{n}:{g.attrs(n)['name']}"
        return f"%{n}"

    def _target(self, n: int, state_out: Mapping[int, str]) -> str:
        text = f"%{n}({self.stored.get(n, '?')})"
        if n in self.into:
            text += f"->%{self.into[n]}"
        where = self.into.get(n, n)
        if where in state_out:
            text += f"@state:{state_out[where]}"
        elif where in self.memory:
            text += "@" + ",".join(f"{w}x{h}#{i}" for (w, h), i in self.memory[where])
        return text

    def kernel_line(self, kernel: Kernel, state_out: Mapping[int, str] | None = None) -> str:
        """One kernel as one line: name, template, viewport (width x height, x pages), targets
        (each with why it is stored, ``->%sum`` when blended into a sum, ``@`` its texture: a
        state or the memory plan's slots, size#index), leaves read (``%n:name`` for inputs),
        fused node count, loop iterations per invocation, ``blend`` when it adds, ``tiled RxC``
        when it runs register-blocked (R rows x C column texels a fragment; ``/S`` with K split
        into S chunks)."""
        state_out = self.state_out() if state_out is None else state_out
        parts = [kernel.name, kernel.template]
        if self.layouts:
            lay = self.layouts[kernel.roots[0]]
            parts.append(f"{lay.width}x{lay.height}" + (f"x{lay.pages}" if lay.pages > 1 else ""))
        parts.append("writes " + " ".join(self._target(r, state_out) for r in kernel.roots))
        parts.append("reads " + (" ".join(self._value(n) for n in kernel.leaves) or "-"))
        parts.append(f"fuses {len(kernel.body)}")
        parts.append(f"loops {self.loop_iterations(kernel)}")
        if kernel.name in self.blended:
            parts.append("blend")
        if kernel.name in self.tilings:
            t = self.tilings[kernel.name]
            parts.append(f"tiled {t.R}x{t.C}" + (f"/{t.S}" if t.S > 1 else ""))
            if kernel.roots[0] in self.from_tiles:
                parts.append("reader gathers")
        return " ".join(parts)

    def __str__(self) -> str:
        head = (
            f"plan {self.entry} after {self.after}: {len(self.graph.g)} nodes, "
            f"{len(self.stored)} stored, {len(self.kernels)} kernels"
        )
        if self.memory:
            head += f", {len({s for slots in self.memory.values() for s in slots})} texture slots"
        if not self.kernels:  # before kernels are formed: the graph, a node a line
            return "\n".join([head, *self._graph_lines()])
        state_out = self.state_out()
        return "\n".join([head, *(self.kernel_line(k, state_out) for k in self.kernels)])

    def _graph_lines(self) -> list[str]:
        """The graph as glcomp.ir.printer prints it (topological order), each node prefixed with
        its texture layout (width x height, x pages) once the layout pass has run."""
        g = self.graph
        lines = []
        for n in self.order or g.topo():
            lay = self.layouts.get(n)
            where = (
                ""
                if lay is None
                else f"{lay.width}x{lay.height}" + (f"x{lay.pages}" if lay.pages > 1 else "")
            )
            lines.append(f"{where} {format_node(g, n)}".strip())
        lines.append("return " + ", ".join(f"{k}=%{v}" for k, v in g.outputs.items()))
        return lines


def check_plan(plan: KernelPlan) -> None:
    """Check every invariant of `plan` that its passes so far have established; raise
    GlcompError naming the entry point, the last pass and the first broken invariant.

    - `order` lists every node once, each after its operands;
    - layouts: every node has one, within the target's texture size; persistent states keep
      the layout their state textures have;
    - kernels: every stored non-input value is written by exactly one kernel (as a root, or as
      the sum its blended terms render to); every operand a kernel computes with is fused into
      it (its body) or read from a stored value (its leaves); kernels come in dependency order
      (a value is read only after every kernel writing it ran); no kernel reads a texture it
      renders to; the targets of a kernel share one viewport (several targets: one page each);
      at most max_draw_buffers targets per kernel and (once texture_units ran) max_texture_units
      sampled pages, and a kernel of several targets runs at most FRAGMENT_LOOP_BUDGET loop
      iterations;
    - blending: each blend target is a stored sum whose add tree reads the term directly, the
      term has the sum's layout, is the single result of its kernel and nothing else reads it;
      the first term's kernel overwrites and the others add;
    - memory: every temporary has one texture slot per page, of its layout's size, and two
      values that are alive at once never share a slot.
    """
    where = f"kernel plan of {plan.entry} after {plan.after}"

    def fail(message: str) -> None:
        raise GlcompError(f"{where}: {message}")

    g = plan.graph
    target = plan.target
    if plan.order:
        position = {n: i for i, n in enumerate(plan.order)}
        if len(position) != len(plan.order) or set(position) != set(g.g.nodes):
            fail("the order does not list every node of the graph exactly once")
        for n in plan.order:
            for o in plan.operands.get(n, g.operands(n)):
                if position[o] >= position[n]:
                    fail(f"%{n} comes before its operand %{o} in the order")
    if plan.layouts:
        size = target.max_texture_size
        for n in g.g.nodes:
            lay = plan.layouts.get(n)
            if lay is None:
                fail(f"%{n} has no layout")
            if lay.width > size or lay.height > size:
                fail(f"%{n} has a {lay.width}x{lay.height} texture, past max_texture_size {size}")
        for n in [*plan.state_in(), *plan.state_out()]:
            if plan.layouts[n] != layout_for(g.shape(n), size):
                fail(f"state value %{n} does not have its state textures' layout")
    if plan.kernels:
        _check_kernels(plan, fail)
    if plan.into:
        _check_blend(plan, fail)
    if plan.memory:
        _check_memory(plan, fail)


def _check_kernels(plan: KernelPlan, fail: Any) -> None:
    g, target = plan.graph, plan.target
    writer: dict[int, list[int]] = {}  # value -> indices of the kernels writing its texture
    sums = set(plan.into.values())
    names = set()
    for i, k in enumerate(plan.kernels):
        if k.name in names:
            fail(f"two kernels are named {k.name}")
        names.add(k.name)
        for v in plan.written(k):
            writer.setdefault(v, []).append(i)
    for n in plan.stored:
        if get_op(g.op(n)).feed:
            if n in writer:
                fail(f"input %{n} is written by kernel {plan.kernels[writer[n][0]].name}")
        elif n in plan.into:
            continue
        elif n not in writer:
            fail(f"stored value %{n} ({plan.stored[n]}) is written by no kernel")
        elif len(writer[n]) > 1 and n not in sums:
            fail(f"stored value %{n} is written by {len(writer[n])} kernels")
    for i, k in enumerate(plan.kernels):
        roots, body, leaves = set(k.roots), set(k.body), set(k.leaves)
        for r in k.roots:
            if r not in plan.stored:
                fail(f"kernel {k.name} writes %{r}, which is not stored")
        for n in k.body:
            if n in plan.stored and n not in roots:
                fail(f"kernel {k.name} recomputes stored value %{n} of another kernel")
        for n in [*k.body, *k.roots]:
            for o in plan.operands.get(n, g.operands(n)):
                if o not in body and o not in leaves:
                    fail(f"kernel {k.name} computes %{n} from %{o}, neither fused into it nor read")
        if set(plan.written(k)) & leaves:
            fail(f"kernel {k.name} reads its own output texture")
        for leaf in k.leaves:
            if leaf not in plan.stored and not get_op(g.op(leaf)).feed:
                fail(f"kernel {k.name} reads %{leaf}, which is not stored")
            if leaf in plan.into:
                fail(f"kernel {k.name} reads %{leaf}, a term blended into %{plan.into[leaf]}")
            late = [j for j in writer.get(leaf, []) if j >= i]
            if late:
                fail(
                    f"kernel {k.name} reads %{leaf} before kernel {plan.kernels[late[0]].name} writes it "
                    "(kernels out of dependency order)"
                )
        if len(k.roots) > target.max_draw_buffers:
            limit = target.max_draw_buffers
            fail(f"kernel {k.name} has {len(k.roots)} targets, past max_draw_buffers {limit}")
        if plan.layouts:
            lays = [plan.layouts[r] for r in k.roots]
            if len({(lay.width, lay.height) for lay in lays}) > 1:
                fail(f"the targets of kernel {k.name} do not share one viewport size")
            if len(lays) > 1 and any(lay.pages > 1 for lay in lays):
                fail(f"kernel {k.name} has several targets, one of them split into pages")
            samplers = sum(plan.layouts[n].pages for n in k.leaves if g.attrs(n).get("role") != "hyper")
            if samplers > target.max_texture_units and "texture_units" in plan.done:
                fail(
                    f"kernel {k.name} samples {samplers} texture pages, "
                    f"past max_texture_units {target.max_texture_units}"
                )
        if len(k.roots) > 1 and plan.loop_iterations(k) > FRAGMENT_LOOP_BUDGET:
            budget = FRAGMENT_LOOP_BUDGET
            fail(f"kernel {k.name} of {len(k.roots)} targets runs past the loop budget {budget}")


def _check_blend(plan: KernelPlan, fail: Any) -> None:
    g = plan.graph
    outputs = set(g.outputs.values())
    single = {k.roots[0]: k for k in plan.kernels if len(k.roots) == 1}
    terms: dict[int, list[int]] = {}
    for t, s in plan.into.items():
        terms.setdefault(s, []).append(t)
        if s not in plan.stored or not get_op(g.op(s)).blend_add:
            fail(f"blend target %{s} is not a stored sum")
        if t not in single:
            fail(f"blended term %{t} is not the single result of a kernel")
        if t in outputs or g.read_count(t) != 1:
            fail(f"blended term %{t} is read by more than its sum %{s}")
        if plan.layouts and plan.layouts[t] != plan.layouts[s]:
            fail(f"blended term %{t} does not have the layout of its sum %{s}")
    position = {k.name: i for i, k in enumerate(plan.kernels)}
    for s, ts in terms.items():
        tree, stack = set(), [s]
        while stack:  # the add tree of s: fused adds under it
            n = stack.pop()
            tree.add(n)
            stack.extend(o for o in g.operands(n) if get_op(g.op(o)).blend_add and o not in plan.stored)
        reads = {o for n in tree for o in g.operands(n)} - tree
        if reads != set(ts):
            fail(f"the terms blended into %{s} are not the terms of its add tree")
        if any(s in k.roots for k in plan.kernels):
            fail(f"sum %{s} is both blended into and computed by a kernel")
        ordered = sorted(ts, key=lambda t: position[single[t].name])
        if single[ordered[0]].name in plan.blended or any(
            single[t].name not in plan.blended for t in ordered[1:]
        ):
            fail(f"the first term of %{s} must overwrite its texture and the others add to it")


def _check_memory(plan: KernelPlan, fail: Any) -> None:
    temps = plan.temporaries()
    for n, pages in temps.items():
        slots = plan.memory.get(n)
        if slots is None or [size for size, _ in slots] != pages:
            fail(f"temporary %{n} does not have one texture slot of its size per page")
    steps = [(plan.written(k), k.leaves) for k in plan.kernels]
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    for i, (writes, reads) in enumerate(steps):
        for v in reads:
            start.setdefault(v, -1)  # read before written: uploaded before the first step
            end[v] = i
        for v in writes:
            start.setdefault(v, i)
            end[v] = i
    for v in plan.readback().values():
        start.setdefault(v, -1)
        end[v] = len(steps)
    holder: dict[Slot, list[int]] = {}
    for v, slots in plan.memory.items():
        if v in start:
            for slot in slots:
                holder.setdefault(slot, []).append(v)
    for slot, values in holder.items():
        values.sort(key=lambda v: start[v])
        latest = values[0]  # of the values so far, the one alive the longest
        for v in values[1:]:
            if start[v] <= end[latest]:
                (w, h), i = slot
                fail(f"%{latest} and %{v} are alive at once in texture slot {w}x{h}#{i}")
            if end[v] > end[latest]:
                latest = v
