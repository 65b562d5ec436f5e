"""GLSL rendering: turn one planned Kernel into fragment-shader source through the templates.

Python does the index arithmetic (strides, offsets, bounds) and hands the templates finished
integer expressions; templates own the dialect and the loop structure. Identifiers in the GLSL
are generated from node ids only; origin comments are filtered to a safe character set.

Nothing here is specific to one op: each op's lowering (glcomp.codegen.families) gives its
template and the template's parameters (`root`, `root4`, `root4t`) and, for fused ops, the body of
its scalar and vec4 functions (`emit`, `emit4`); the renderer hands those hooks a frozen
`RenderContext` of the kernel and collects what their results read.
"""

from __future__ import annotations

import math
from typing import Any

from glcomp.codegen.families import (
    RenderContext,
    Rendered,
    environment,
    is_fused,
    lowering,
    safe_comment,
    template_of,
)
from glcomp.codegen.families.base import reads_of, template_params
from glcomp.codegen.families.glsl import flat as _flat
from glcomp.codegen.families.glsl import index_args as _args
from glcomp.codegen.families.glsl import params
from glcomp.codegen.families.glsl import strides as _strides
from glcomp.codegen.families.movement import ZERO_UNIFORM
from glcomp.codegen.kernels import Kernel
from glcomp.codegen.layout import Layout
from glcomp.codegen.loops import FRAGMENT_LOOP_BUDGET, MAX_UNROLL, fragment_iterations
from glcomp.codegen.target import Target
from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op

__all__ = ["KernelRenderer", "Rendered", "vertex_shader"]


def _squeezable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether shapes `a` and `b` hold the same elements in the same texel rows: equal once
    size-1 axes are dropped, with the same last axis."""
    return bool(a) and bool(b) and a[-1] == b[-1] and [s for s in a if s != 1] == [s for s in b if s != 1]


class KernelRenderer:
    """Renders kernels of one graph; `layouts` holds the layout of every stored node. Each
    kernel's family hooks receive a frozen `RenderContext` of it (`ctx`)."""

    def __init__(self, graph: Graph, layouts: dict[int, Layout], target: Target, rgba8: bool = False) -> None:
        self.graph, self.layouts, self.target = graph, layouts, target
        self.rgba8 = rgba8  # every texture holds float32 bytes in RGBA8 texels (storage="rgba8")
        self.webgl1 = target.webgl1
        self.position = {n: i for i, n in enumerate(graph.topo())}
        self.want4 = set()
        self.want4t: set[int] = set()  # stored leaves read a column texel at a time (`Fetch4t`)
        self.ctx = RenderContext(graph, layouts, frozenset(), 1, self.webgl1)  # per kernel (`render`)
        self._operands: dict[int, list[int]] = {}  # graph.operands, read once per node
        # products read from their tiles (KernelPlan.from_tiles) -> their tiling
        self.from_tiles: dict[int, Any] = {}

    def operands(self, n: int) -> list[int]:
        """``graph.operands(n)`` (the graph does not change while its kernels are rendered)."""
        ops = self._operands.get(n)
        if ops is None:
            ops = self._operands[n] = self.graph.operands(n)
        return ops

    def fn(self, n: int) -> str:
        return f"v{n}"

    def call(self, n: int, args: list[str]) -> str:
        return f"v{n}({', '.join(args)})"

    # -- functions for leaves and fused nodes --------------------------------------------------------
    def leaf_function(self, n: int, uniforms: dict[int, str]) -> dict[str, Any]:
        shape = self.graph.shape(n)
        sig = f"float v{n}({params(len(shape))})"
        if n in uniforms:
            return {"sig": sig, "lines": [f"return {uniforms[n]};"]}
        args = _args(len(shape))
        row = _flat(args[:-1], shape[:-1]) if len(shape) > 1 else "0"
        j = args[-1] if shape else "0"
        return {"sig": sig, "lines": [f"return glc_fetch_{n}({row}, {j});"]}

    def node_function(self, n: int) -> dict[str, Any]:
        """The scalar GLSL function of fused node `n`: an elementwise op's expression over its
        operands, or the body its op's `emit` hook writes (movement, index, constants)."""
        g = self.graph
        rule, shape, ins = get_op(g.op(n)), g.shape(n), self.operands(n)
        args = _args(len(shape))
        sig = f"float v{n}({params(len(shape))})"
        lines: list[str]
        if rule.kind == "elementwise":
            names = "abc"
            lines = [f"float {names[k]} = {self.call(src, args)};" for k, src in enumerate(ins)]
            lines.append(f"return {rule.glsl};")
        elif (low := lowering(g.op(n))) is not None and low.emit is not None:
            lines = low.emit(self.ctx, n, args)
        else:
            raise GlcompError(f"no fused rendering for op {g.op(n)!r} (node %{n})")
        return {"sig": sig, "lines": lines}

    unroll = 1  # loop body repetition of the kernel being rendered (see `render`)
    want4: set[int]  # nodes whose vec4 functions the kernel being rendered calls (see `fn4`)

    def function(self, n: int) -> dict[str, Any]:
        """The GLSL function computing fused node `n`: a loop op (fused as an epilogue's operand)
        is rendered by its family template's macro, anything else by `node_function`."""
        if is_fused(self.graph, n):
            return self.node_function(n)
        return {"name": f"v{n}", "template": template_of(self.graph.op(n)), "spec": self.root(n)}

    # -- roots ------------------------------------------------------------------------------------
    def root(self, n: int) -> dict[str, Any]:
        """The parameters of the `root` macro of node `n`'s template: a loop op's from its `spec`
        hook, a fused op's call of its scalar function (map.frag.j2)."""
        g = self.graph
        low = lowering(g.op(n))
        shape = g.shape(n)
        r: dict[str, Any] = {"params": params(len(shape)), "unroll": self.unroll}
        if low is not None and low.root is not None:
            return r | self._take(low.root(self.ctx, n))
        if is_fused(g, n):
            r["call"] = self.call(n, _args(len(shape)))
            return r
        raise GlcompError(f"no kernel template for op {g.op(n)!r}")

    # -- vec4 roots ------------------------------------------------------------------------------
    def _take(self, result: Any) -> dict[str, Any]:
        """A family hook's result as template parameters; the vec4 functions and transposed texel
        reads it names become the kernel's to define (`want4`, `want4t`)."""
        vec4, transposed = reads_of(result)
        self.want4 |= vec4
        self.want4t |= transposed
        return template_params(result)

    def root4_head(self, n: int) -> dict[str, Any]:
        return self.ctx.root4_head(n)

    def root4(self, n: int) -> dict[str, Any] | None:
        """What the family template's `root4` macro needs to compute a whole output texel of loop
        node `n` at once (its op's `spec4`), or None when `n` keeps the scalar path. `textures`
        are the kernel's stored leaves (not uniforms): operands among them are read texel-wise."""
        low = lowering(self.graph.op(n))
        v4 = None if low is None or low.root4 is None else low.root4(self.ctx, n)
        return None if v4 is None else self._take(v4)

    def root4t(self, n: int) -> dict[str, Any] | None:
        """Like `root4`, for a 2-D loop node read transposed: the macro `root4t` computes the
        column texel (n[j0 + c, i0])_c (its op's `spec4t`)."""
        low = lowering(self.graph.op(n))
        v4 = None if low is None or low.root4t is None else low.root4t(self.ctx, n)
        return None if v4 is None else self._take(v4)

    def _epilogue_loop(self, root: int, kernel: Kernel) -> tuple[int, str] | None:
        """The fused loop node of a single-root map kernel and how the root reads it: "same" (through
        elementwise ops and reshapes that only add or drop size-1 axes: at the root's own index),
        "transposed" (also through one 2-D transpose: at the swapped index) or "flat" (through
        reshapes: at the same flat index; both last axes multiples of 4, so a texel of the root is
        a texel of the loop node)."""
        g = self.graph
        body = set(kernel.body)

        def view(n: int, state: str | None) -> str | None:
            kind, how = get_op(g.op(n)).kind, self.ctx.view(n)
            if state is None or kind == "elementwise":
                return state
            if how == "transpose" and state != "flat":
                return "transposed" if state == "same" else "same"
            if how == "flat" and state in ("same", "flat"):
                squeeze = state == "same" and _squeezable(g.shape(g.operands(n)[0]), g.shape(n))
                return "same" if squeeze else "flat"
            return None

        found: dict[int, set[str | None]] = {}
        stack = [(root, view(root, "same"))]
        seen: set[tuple[int, str | None]] = set()
        while stack:
            m, state = stack.pop()
            if (m, state) in seen:
                continue
            seen.add((m, state))
            for src in self.operands(m):
                if src not in body:
                    continue
                if not is_fused(g, src):
                    found.setdefault(src, set()).add(state)
                else:
                    stack.append((src, view(src, state)))
        if len(found) != 1:
            return None
        ((loop, states),) = found.items()
        if len(states) != 1 or None in states:
            return None
        (how,) = states
        rs, ls = g.shape(root), g.shape(loop)
        if how == "transposed":
            ok = ls == tuple(reversed(rs))
        elif how == "flat":
            ok = bool(rs) and bool(ls) and rs[-1] % 4 == 0 and ls[-1] % 4 == 0
        else:
            ok = _squeezable(ls, rs)
        return (loop, str(how)) if ok else None

    def _cache_call(self, root: int, loop: int, how: str) -> dict[str, Any]:
        """How the root's root4 fills the cache of `loop` for its texel at (i0, ..., j0): lines to
        run first, the arguments of the loop's root4 and the loop's first column."""
        g = self.graph
        rs, ls = g.shape(root), g.shape(loop)
        name = self.fn(loop)
        if how == "transposed":
            return {"name": name, "pre": [], "args4": "i0, j0", "j0": "j0"}
        if how == "same":  # the non-1 leading axes correspond in order
            names = iter(f"i{k}" for k in range(len(rs) - 1) if rs[k] != 1)
            args = [*("0" if s == 1 else next(names) for s in ls[:-1]), "j0"]
            return {"name": name, "pre": [], "args4": ", ".join(args), "j0": "j0"}
        f = f"glc_f{loop}"
        row = _flat(_args(len(rs) - 1), rs[:-1]) if len(rs) > 1 else "0"
        lead = []
        for k in range(len(ls) - 1):
            expr = f"{f} / {math.prod(ls[k + 1 :])}"
            lead.append(expr if k == 0 else f"imod({expr}, {ls[k]})")
        col = f"imod({f}, {ls[-1]})"
        return {
            "name": name,
            "pre": [f"int {f} = ({row}) * {rs[-1]} + j0;"],
            "args4": ", ".join([*lead, col]),
            "j0": col,
        }

    # -- vec4 element functions -----------------------------------------------------------------
    def fn4(self, n: int) -> str:
        """The name of node `n`'s vec4 function (rank >= 1), which the kernel being rendered then
        defines: `vec4 v<n>_4(int i0, ..., int j0)`, the elements (i0, ..., j0 + c)_c."""
        self.want4.add(n)
        return self.ctx.fn4(n)

    def call4(self, n: int, lead: list[str], j0: str) -> str:
        """A call of node `n`'s vec4 function: the elements (lead..., j0 + c)_c, j0 a multiple of 4."""
        self.want4.add(n)
        return self.ctx.call4(n, lead, j0)

    def _gather4(self, n: int, lead: list[str]) -> str:
        """The texel (lead..., j0 + c)_c of `n` from four calls of its scalar function, each column
        clamped to the row (components past the row end are masked by main())."""
        last = self.graph.shape(n)[-1]
        if last == 1:  # one element per row (a reduction's result): one call
            return f"vec4({self.call(n, [*lead, '0'])})"
        cols = ["j0", *(f"(j0 + {c} < {last} ? j0 + {c} : {last - 1})" for c in (1, 2, 3))]
        return f"vec4({', '.join(self.call(n, [*lead, j]) for j in cols)})"

    def function4(
        self, n: int, uniform_of: dict[int, str], textures: set[int]
    ) -> tuple[list[str], list[int], list[int]]:
        """The body of `vec4 v<n>_4(int i0, ..., int j0)`, the elements (i0, ..., j0 + c)_c of node `n`
        (rank >= 1, j0 a multiple of 4; components past the row end are unspecified), and the nodes
        it calls: (lines, nodes called by their vec4 function, nodes called by their scalar one).

        Elementwise ops compute on vec4s (`glsl4`, or `glsl` where it is valid on vec4s); stored
        leaves are read a texel at a time (texel t of `n` is texel t of the leaf: same row, same
        column); ops with an `emit4` hook (views that keep texels whole, broadcasts) write their
        own body where they can. Anything else is gathered from its scalar function, four calls
        per texel (the columns clamped to the row)."""
        g = self.graph
        shape = g.shape(n)
        lead = [f"i{k}" for k in range(len(shape) - 1)]
        if n in uniform_of:
            return [f"return vec4({uniform_of[n]});"], [], []
        if n in textures:
            row = _flat(lead, shape[:-1]) if lead else "0"
            return [f"return glc_fetch_{n}_4({row}, j0);"], [], []
        rule = get_op(g.op(n))
        if math.prod(shape) == 1:
            return [f"return vec4({self.call(n, ['0'] * len(shape))});"], [], [n]
        if rule.kind == "elementwise":
            return self._elementwise4(n, lead, uniform_of, textures)
        low = lowering(g.op(n))
        if low is not None and low.emit4 is not None:
            form = low.emit4(self.ctx, n, lead)
            if form is not None:
                self.want4t.update(form.transposed)
                return form.lines, form.vec4, form.scalar
        return [f"return {self._gather4(n, lead)};"], [], [n]

    def _elementwise4(
        self, n: int, lead: list[str], uniform_of: dict[int, str], textures: set[int]
    ) -> tuple[list[str], list[int], list[int]]:
        """The body of elementwise node `n`'s vec4 function: `_ssa4` of `n`, returning its local."""
        lines, called = self._ssa4([n], lead, uniform_of, textures)
        return [*lines, f"return e{n};"], called, []

    def _ssa4(
        self, targets: list[int], lead: list[str], uniform_of: dict[int, str], textures: set[int]
    ) -> tuple[list[str], list[int]]:
        """Straight-line code computing the texel (lead..., j0 + c)_c of each of `targets` (nodes of
        one shape) into a local `e<node>`: every elementwise node of the fused DAG below them (read
        at the same texel, as elementwise ops read their operands) is computed once, in dependency
        order, and anything else (leaves, views, loop nodes) is called once through its vec4
        function. Returns the lines and the nodes whose vec4 functions they call.

        A DAG written as nested calls is a tree once the shader compiler inlines it: a value read
        twice (x * x, Adam's gradient in both moments, a gradient feeding several render targets)
        is computed twice, and the compiler's time (a software renderer's JIT compiles a program
        at its first draw) grows with the tree, not with the DAG. Guarantee: the same operations
        on the same values as the nested form."""
        g = self.graph
        shape = g.shape(targets[0])
        lines: list[str] = []
        local: dict[int, str] = {}
        called: list[int] = []

        def inline(m: int) -> bool:
            return (
                get_op(g.op(m)).kind == "elementwise"
                and m not in uniform_of
                and m not in textures
                and g.shape(m) == shape
                and math.prod(shape) != 1
            )

        stack: list[tuple[int, bool]] = [(t, False) for t in reversed(targets)]
        while stack:
            m, ready = stack.pop()
            if m in local:
                continue
            ins = self.operands(m)
            if not inline(m):
                local[m] = f"e{m}"
                lines.append(f"vec4 e{m} = {self.call4(m, lead, 'j0')};")
                called.append(m)
            elif ready:
                rule = get_op(g.op(m))
                binds = [f"vec4 {'abc'[k]} = {local[src]}; " for k, src in enumerate(ins)]
                local[m] = f"e{m}"
                lines.append(f"vec4 e{m};")
                lines.append(f"{{ {''.join(binds)}e{m} = {rule.glsl4 or rule.glsl}; }}")
            else:
                stack.append((m, True))
                stack.extend((src, False) for src in reversed(ins) if src not in local)
        return lines, called

    def plan4(
        self, roots: list[int], uniform_of: dict[int, str], textures: set[int]
    ) -> tuple[dict[int, list[str]], set[int]]:
        """The vec4 functions computing `roots` a texel at a time (node -> body) and the nodes
        they call through scalar functions."""
        bodies: dict[int, list[str]] = {}
        scalar: set[int] = set()
        todo = list(roots)
        while todo:
            n = todo.pop()
            if n in bodies:
                continue
            lines, vec4_deps, scalar_deps = self.function4(n, uniform_of, textures)
            bodies[n] = lines
            todo.extend(vec4_deps)
            scalar.update(scalar_deps)
        return bodies, scalar

    # -- whole kernel ----------------------------------------------------------------------------
    def _groups(
        self,
        nodes: list[int],
        roots: list[dict[str, Any]],
        outputs: list[dict[str, Any]],
        chains: list[int],
        uniform_of: dict[int, str],
        textures: set[int],
    ) -> tuple[list[dict[str, Any]], list[int]]:
        """main()'s groups of consecutive render targets of one geometry (`nodes`, with their root
        specs and output dicts), which share its index arithmetic, and the nodes whose vec4
        functions the kernel then defines first (the chain roots not computed in main()).

        Two or more fused chains of a group (without a loop cache) are computed in main()
        together as straight-line code (`_ssa4`: each value they share once) instead of through
        one glc_root function each: their roots are marked "inline" and their outputs read the
        local. Guarantee: every target gets the same values as through its own function."""
        g = self.graph
        groups: list[dict[str, Any]] = []
        for i, o in enumerate(outputs):
            key = (o["texels"], o["row_texels"], o["row_len"], o["args"], o.get("args4"), *o["unflatten"])
            if groups and groups[-1]["key"] == key:
                groups[-1]["members"].append(i)
            else:
                groups.append({"key": key, "members": [i], "lines": []})
        seeds = list(chains)
        for grp in groups:
            shared = [i for i in grp["members"] if nodes[i] in chains and "caches" not in roots[i]["vec4"]]
            if len(shared) < 2:
                continue
            lead = [f"i{k}" for k in range(len(g.shape(nodes[shared[0]])) - 1)]
            lines, called = self._ssa4([nodes[i] for i in shared], lead, uniform_of, textures)
            grp["lines"] = lines
            for i in shared:
                outputs[i]["local"] = f"e{nodes[i]}"
                roots[i]["inline"] = True
                seeds.remove(nodes[i])
            seeds += called
        return groups, seeds

    def _output(self, n: int) -> dict[str, Any]:
        """How main() maps a texel of root `n`'s texture to its elements."""
        lay, shape = self.layouts[n], self.graph.shape(n)
        lead = list(shape[:-1])
        unflatten = []
        for k, (st, s) in enumerate(zip(_strides(tuple(lead)), lead)):
            expr = "row" if st == 1 else f"row / {st}"
            unflatten.append(f"int i{k} = {expr if k == 0 else f'imod({expr}, {s})'};")
        args = ", ".join([f"i{k}" for k in range(len(lead))] + (["j"] if shape else []))
        return {
            "row_texels": lay.row_texels,
            "texels": lay.texels,
            "row_len": lay.row_len,
            "unflatten": unflatten,
            "args": args,
        }

    def kernel_unroll(self, kernel: Kernel) -> int:
        """The smallest loop body repetition (a power of two) that keeps `kernel` within
        FRAGMENT_LOOP_BUDGET loop iterations per invocation; GlcompError when none up to MAX_UNROLL
        does (the kernel would return partial sums on software rasterizers)."""
        leaves, limit = set(kernel.leaves), self.target.max_loop_iterations
        unroll = 1
        while True:
            count = fragment_iterations(self.graph, kernel.roots, leaves, limit, unroll)
            if count <= FRAGMENT_LOOP_BUDGET:
                return unroll
            if unroll >= MAX_UNROLL:
                where = ", ".join(kernel.origins) or kernel.name
                raise GlcompError(
                    f"{where}: kernel {kernel.name} runs {count} loop iterations per texel even with "
                    f"its loops unrolled {MAX_UNROLL} times, more than the {FRAGMENT_LOOP_BUDGET} a "
                    "shader invocation may run (software rasterizers such as llvmpipe stop every loop "
                    "after 65535 iterations); use a smaller batch or smaller inputs"
                )
            unroll *= 2

    def render(self, kernel: Kernel, hypers: dict[int, str]) -> Rendered:
        g, t = self.graph, self.target
        self.unroll = self.kernel_unroll(kernel)
        self.want4 = set()
        self.want4t = set()
        samplers: list[tuple[str, int, int]] = []
        uniforms: list[tuple[str, str]] = []
        uniform_of: dict[int, str] = {}
        fetches = []
        for leaf in kernel.leaves:
            if leaf in hypers:
                name = f"u_h{len(uniforms)}"
                uniforms.append((name, hypers[leaf]))
                uniform_of[leaf] = name
                continue
            tiling = self.from_tiles.get(leaf)
            if tiling is not None:  # read from its tiles, gathering as it reads
                names = [f"s{leaf}_{i}" for i in range(len(tiling.tiles))]
                samplers += [(s, tile, 0) for s, tile in zip(names, tiling.tiles, strict=True)]
                tiled = tiling.read_params(self.target.max_texture_size)
                fetches.append({"node": leaf, "samplers": names, "tiled": tiled})
                continue
            lay = self.layouts[leaf]
            names = [f"s{leaf}_{p}" for p in range(lay.pages)]
            samplers += [(s, leaf, p) for p, s in enumerate(names)]
            fetches.append(
                {
                    "node": leaf,
                    "row_texels": lay.row_texels,
                    "page_texels": lay.page_texels,
                    "pages": lay.pages,
                    "width": lay.width,
                    "height": lay.height,
                    "shift": self.ctx.shift(lay.width),
                    "samplers": names,
                    "tiled": None,
                }
            )
        # Fused nodes and elementwise roots (which MRT groups may also read inline), each defined
        # once, in topological order so callees come before callers (rewrites such as transpose
        # push-down create nodes with ids above their readers').
        inline = set(kernel.body) | {r for r in kernel.roots if is_fused(g, r)}
        # vec4 roots: a loop root with a root4 form; a map root computes its fused chain a texel at
        # a time through vec4 functions (plan4), after filling the cache of its only loop node
        # when that one (an epilogue operand read at the root's index) has a root4 form.
        # Leaves the families may read as textures: not a product read from its tiles (its
        # samplers are the tiles; a matmul reading it through a reshape read its first tile).
        textures = {leaf for leaf in kernel.leaves if leaf not in uniform_of and leaf not in self.from_tiles}
        self.ctx = RenderContext(g, self.layouts, frozenset(textures), self.unroll, self.webgl1)
        roots, cached, chains = [], {}, []
        for n in kernel.roots:
            spec = self.root(n) | {"template": template_of(g.op(n))}
            v4 = self.root4(n)
            fused = is_fused(g, n)
            if v4 is None and len(kernel.roots) == 1 and fused:
                found = self._epilogue_loop(n, kernel)
                cache = None
                if found is not None:
                    loop, how = found
                    cache = self.root4t(loop) if how == "transposed" else self.root4(loop)
                if cache is not None:
                    cached[loop] = cache
                    v4 = {"caches": [self._cache_call(n, loop, how)]}
            if fused and g.shape(n) and (v4 is None or "caches" in v4):
                lead = [f"i{k}" for k in range(len(g.shape(n)) - 1)]
                v4 = self.root4_head(n) | (v4 or {}) | {"chain": self.call4(n, lead, "j0")}
                chains.append(n)
            if v4 is not None:
                spec["vec4"] = v4
            roots.append(spec)
        # A reduction to one element per row (mode "L") is texel-wise in any context: its scalar
        # function returns the first lane of its root4.
        single = {}
        for n in inline - set(cached):
            if get_op(g.op(n)).kind == "reduce":
                asked = set(self.want4)
                v4 = self.root4(n)
                if v4 is not None and v4["mode"] == "L":
                    lead = [f"i{k}" for k in range(len(g.shape(n)) - 1)]
                    single[n] = v4 | {"single": ", ".join([*lead, "0"])}
                else:
                    self.want4 = asked  # the form not taken reads nothing
        # Loop templates read fused operands a texel at a time through vec4 functions (fn4);
        # render targets of one geometry share main()'s work (_groups).
        outputs = [self._output(r) for r in kernel.roots]
        for o, spec in zip(outputs, roots):
            if "vec4" in spec:
                o |= {"vec4": True, "args4": spec["vec4"]["args4"]}
        groups, seeds = self._groups(kernel.roots, roots, outputs, chains, uniform_of, textures)
        bodies, scalar_seeds = self.plan4([*seeds, *sorted(self.want4)], uniform_of, textures)
        # Scalar functions are defined where something calls them: scalar roots, the operands of
        # loop roots and of every scalar function, and the gathers of vec4 functions.
        needed: set[int] = set()
        todo = [*scalar_seeds, *(n for n in kernel.roots if n not in chains)]
        while todo:
            n = todo.pop()
            if n in needed:
                continue
            needed.add(n)
            if n not in kernel.leaves:
                todo.extend(self.operands(n))
        for f in fetches:
            f["scalar"], f["vec4t"] = f["node"] in needed, f["node"] in self.want4t
            f["vec4"] = f["node"] in bodies or f["vec4t"]
            f["rows"] = g.shape(f["node"])[0] if f["vec4t"] else 0
        functions = [self.leaf_function(leaf, uniform_of) for leaf in kernel.leaves if leaf in needed]
        order = sorted(inline & needed, key=self.position.__getitem__)
        ordered = [self.function(n) for n in order]
        for n, fn in zip(order, ordered):
            if n in cached:
                fn["spec"] = fn["spec"] | {"vec4": cached[n]}
            elif n in single:
                fn["spec"] = fn["spec"] | {"vec4": single[n]}
        # Callees before callers: in topological order, a node's scalar function (which may read its
        # own template's vec4 cache or call its operands' vec4 functions) before its vec4 function
        # (which may gather from it); leaves first.
        slots = [((self.position[n], 0), fn) for n, fn in zip(order, ordered)]
        for n, lines in bodies.items():
            head = self.root4_head(n)
            key = (-1, self.position[n]) if n in kernel.leaves else (self.position[n], 1)
            slots.append((key, {"sig": f"vec4 v{n}_4({head['params4']})", "lines": lines}))
        functions += [fn for _, fn in sorted(slots, key=lambda s: s[0])]
        for grp in groups:
            grp["outputs"] = [(i, outputs[i]) for i in grp["members"]]
        # zeros that reach a product read an integer uniform every draw sets to 0 (const_emit)
        zero = any(ZERO_UNIFORM in line for fn in functions for line in fn.get("lines", ()))
        ints = {ZERO_UNIFORM: 0} if zero else {}
        context = {
            "webgl1": t.webgl1,
            "rgba8": self.rgba8,
            "kernel_name": kernel.name,
            "node_ids": ", ".join(f"%{n}" for n in [*kernel.body, *kernel.roots]),
            "origins": [safe_comment(o) for o in kernel.origins],
            "outputs": outputs,
            "groups": groups,
            "samplers": [s for s, _, _ in samplers],
            "uniforms": [u for u, _ in uniforms],
            "ints": list(ints),
            "fetches": fetches,
            "functions": functions,
            "roots": roots,
            "max_loop": t.max_loop_iterations,
            "width": self.layouts[kernel.roots[0]].width,
        }
        source = environment().get_template("_kernel.j2").render(context)
        return Rendered(source, samplers, uniforms, ints)


def vertex_shader(target: Target) -> str:
    """The one vertex shader: a triangle that covers the viewport."""
    return environment().get_template("quad.vert.j2").render(webgl1=target.webgl1)
