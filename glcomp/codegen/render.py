"""GLSL rendering: turn one planned Kernel into fragment-shader source through the templates.

Python does the index arithmetic (strides, offsets, bounds) and hands the templates finished
integer expressions; templates own the dialect and the loop structure. Identifiers in the GLSL
are generated from node ids only; origin comments are filtered to a safe character set.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from glcomp.codegen.layout import Layout
from glcomp.codegen.plan import Kernel
from glcomp.codegen.target import Target
from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op

FUSED_ROOT = ("elementwise", "movement", "index", "source")

# Loop iterations one fragment-shader invocation may run in all, over every loop of the shader.
# Mesa's llvmpipe (the software rasterizer the tests and many headless machines run) keeps one
# loop limiter per invocation, shared by all loops, and silently leaves every loop once it has
# counted 65535 iterations (LP_MAX_TGSI_LOOP_ITERATIONS): a kernel past it returns partial sums.
# Every back-edge counts, outer loops included; the budget keeps a margin below the limit.
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


def _loop_extent(graph: Graph, n: int) -> int:
    """The index count of the loop op `n`'s template loop."""
    op, attrs = graph.op(n), graph.attrs(n)
    ins = [graph.shape(i) for i in graph.operands(n)]
    if op == "matmul":
        return ins[0][1]
    if op == "conv2d":
        return ins[1][1] * ins[1][2] * ins[1][3]
    if op == "conv2d_input_grad":
        return ins[0][1] * ins[1][2] * ins[1][3]
    if op == "conv2d_weight_grad":
        return ins[0][0] * ins[1][2] * ins[1][3]
    if get_op(op).kind == "reduce":
        return math.prod(ins[0][a] for a in attrs["axes"])
    if get_op(op).kind == "pool":
        return math.prod(attrs["kernel"])
    raise GlcompError(f"no loop model for op {op!r} (node %{n})")


def fragment_iterations(graph: Graph, roots: list[int], leaves: set[int], limit: int, unroll: int = 1) -> int:
    """Loop iterations one invocation of a kernel with these `roots` runs, counted as the loop
    limiter of a software rasterizer counts them: every root is evaluated once per channel of its
    texel (4 times), and a fused node is recomputed at every read. `leaves` are the values the
    kernel samples (no work); `limit` is the target's per-loop limit and `unroll` the body
    repetition of the rendered loops. Guarantee: never less than what the rendered shader runs."""
    memo: dict[int, int] = {}

    def calls(n: int) -> int:
        if n in leaves or graph.op(n) in ("const", "input"):
            return 0
        if n in memo:
            return memo[n]
        ops = graph.operands(n)
        kind = get_op(graph.op(n)).kind
        if kind in FUSED_ROOT:
            total = sum(calls(o) for o in ops)
        else:
            trips, runs = loop_trips(_loop_extent(graph, n), limit, unroll)
            per_run = sum(calls(o) for o in ops)
            if graph.op(n) == "max_pool2d_grad":  # an inner argmax loop over the window per tap
                window = math.prod(graph.attrs(n)["kernel"])
                per_run = window + window * calls(ops[0]) + calls(ops[1])
            total = trips + runs * per_run
        memo[n] = total
        return total

    return sum(4 * calls(r) for r in roots)


def root_template(graph: Graph, n: int) -> str:
    """The family template whose `root` macro computes node `n` as a render target."""
    rule = get_op(graph.op(n))
    return "map" if rule.kind in FUSED_ROOT else str(rule.template)


def templates_dir() -> Path:
    """The template folder: `templates/` in a source checkout, `glcomp/templates` in a wheel."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "_kernel.j2").exists():
            return candidate
    raise GlcompError(f"GLSL templates not found next to {here}")


@cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,  # a template asking for a missing value is a bug
        trim_blocks=False,
        keep_trailing_newline=True,
    )


_SAFE = re.compile(r"[^A-Za-z0-9_.() \[\]-]")


def safe_comment(text: str) -> str:
    return _SAFE.sub("_", text)[:120]


def glsl_float(value: float) -> str:
    if math.isnan(value):
        raise GlcompError("NaN constant in a kernel")
    if math.isinf(value):
        return "3.0e38" if value > 0 else "-3.0e38"
    text = repr(float(value))
    return text if any(c in text for c in ".e") else text + ".0"


def params(rank: int) -> str:
    return ", ".join(f"int i{k}" for k in range(rank))


def _args(rank: int) -> list[str]:
    return [f"i{k}" for k in range(rank)]


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return list(reversed(out))


def _flat(args: list[str], shape: tuple[int, ...]) -> str:
    terms = [a if st == 1 else f"{a} * {st}" for a, st, s in zip(args, _strides(shape), shape) if s != 1]
    return " + ".join(terms) or "0"


def _squeezable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether shapes `a` and `b` hold the same elements in the same texel rows: equal once
    size-1 axes are dropped, with the same last axis."""
    return bool(a) and bool(b) and a[-1] == b[-1] and [s for s in a if s != 1] == [s for s in b if s != 1]


@dataclass
class Rendered:
    source: str
    samplers: list[tuple[str, int, int]]  # (uniform name, node, page)
    uniforms: list[tuple[str, str]]  # (uniform name, hyper-parameter name)


class KernelRenderer:
    """Renders kernels of one graph; `layouts` holds the layout of every stored node."""

    def __init__(self, graph: Graph, layouts: dict[int, Layout], target: Target) -> None:
        self.graph, self.layouts, self.target = graph, layouts, target
        self.position = {n: i for i, n in enumerate(graph.topo())}

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
        g = self.graph
        op, attrs, shape = g.op(n), g.attrs(n), g.shape(n)
        rule = get_op(op)
        ins = g.operands(n)
        args = _args(len(shape))
        sig = f"float v{n}({params(len(shape))})"
        lines: list[str]
        if op == "const":
            lines = [f"return {glsl_float(attrs['value'])};"]
        elif rule.kind == "elementwise":
            names = "abc"
            lines = [f"float {names[k]} = {self.call(src, args)};" for k, src in enumerate(ins)]
            lines.append(f"return {rule.glsl};")
        elif op == "one_hot":
            label = self.call(ins[0], args[:-1])
            lines = [f"return int(floor({label} + 0.5)) == {args[-1]} ? 1.0 : 0.0;"]
        elif op == "reshape":
            src_shape = g.shape(ins[0])
            lines = [f"int f = {_flat(args, shape)};"]
            src_args = []
            for k, (st, s) in enumerate(zip(_strides(src_shape), src_shape)):
                expr = "f" if st == 1 else f"f / {st}"
                src_args.append("0" if s == 1 else (expr if k == 0 else f"imod({expr}, {s})"))
            lines.append(f"return {self.call(ins[0], src_args)};")
        elif op == "permute":
            src_args = [""] * len(shape)
            for k, p in enumerate(attrs["perm"]):
                src_args[p] = args[k]
            lines = [f"return {self.call(ins[0], src_args)};"]
        elif op == "expand":
            src_shape = g.shape(ins[0])
            src_args = ["0" if s == 1 else a for a, s in zip(args, src_shape)]
            lines = [f"return {self.call(ins[0], src_args)};"]
        elif op == "slice":
            src_args = [f"({a} + {lo})" if lo else a for a, lo in zip(args, attrs["starts"])]
            lines = [f"return {self.call(ins[0], src_args)};"]
        elif op == "pad":
            src_shape = g.shape(ins[0])
            conds, src_args = [], []
            for a, lo, hi, size in zip(args, attrs["before"], attrs["after"], src_shape):
                if lo:
                    conds.append(f"{a} >= {lo}")
                if lo or hi:
                    conds.append(f"{a} < {lo + size}")
                shifted = f"{a} - {lo}" if lo else a
                src_args.append(f"iclamp({shifted}, 0, {size - 1})" if lo or hi else a)
            cond = " && ".join(conds) or "true"
            # Read at a clamped index, then select: no texture read inside a branch.
            lines = [f"float x = {self.call(ins[0], src_args)};", f"return ({cond}) ? x : 0.0;"]
        elif op == "concat":
            axis, at, lines = attrs["axis"], 0, []
            branchless = self.target.webgl1  # texture2D must not run under a divergent branch
            for k, src in enumerate(ins):
                size = g.shape(src)[axis]
                pos = f"{args[axis]} - {at}" if at else args[axis]
                if branchless:
                    pos = f"iclamp({pos}, 0, {size - 1})"
                src_args = [pos if i == axis else a for i, a in enumerate(args)]
                value = self.call(src, src_args)
                last = k == len(ins) - 1
                if branchless:
                    lines.append(f"float x{k} = {value};")
                else:
                    ret = f"return {value};"
                    lines.append(ret if last else f"if ({args[axis]} < {at + size}) {ret}")
                at += size
            if branchless:
                expr, at = f"x{len(ins) - 1}", sum(g.shape(i)[axis] for i in ins)
                for k in reversed(range(len(ins) - 1)):
                    at -= g.shape(ins[k + 1])[axis]
                    expr = f"({args[axis]} < {at} ? x{k} : {expr})"
                lines.append(f"return {expr};")
        else:
            raise GlcompError(f"no fused rendering for op {op!r} (node %{n})")
        return {"sig": sig, "lines": lines}

    unroll = 1  # loop body repetition of the kernel being rendered (see `render`)

    def function(self, n: int) -> dict[str, Any]:
        """The GLSL function computing fused node `n`: a loop op (fused as an epilogue's operand)
        is rendered by its family template's macro, anything else by `node_function`."""
        rule = get_op(self.graph.op(n))
        if rule.kind in FUSED_ROOT:
            return self.node_function(n)
        return {"name": f"v{n}", "template": root_template(self.graph, n), "spec": self.root(n)}

    # -- roots ------------------------------------------------------------------------------------
    def root(self, n: int) -> dict[str, Any]:
        g = self.graph
        rule = get_op(g.op(n))
        attrs, ins = g.attrs(n), g.operands(n)
        shape = g.shape(n)
        r: dict[str, Any] = {"params": params(len(shape)), "unroll": self.unroll}
        if rule.template == "matmul" or rule.kind in ("elementwise", "movement", "index", "source"):
            if rule.template == "matmul":
                r |= {"K": g.shape(ins[0])[1], "a": self.fn(ins[0]), "b": self.fn(ins[1])}
            else:
                r["call"] = self.call(n, _args(len(shape)))
            return r
        if rule.kind == "reduce":
            src_shape = g.shape(ins[0])
            axes = attrs["axes"]
            extents = [src_shape[a] for a in axes]
            decompose, read = [], _args(len(shape))
            stride = 1
            for a, e in reversed(list(zip(axes, extents))):
                expr = "q" if stride == 1 else f"q / {stride}"
                decompose.insert(0, f"int r{a} = {expr if a == axes[0] else f'imod({expr}, {e})'};")
                read[a] = f"r{a}"
                stride *= e
            r |= {
                "total": math.prod(extents),
                "decompose": decompose,
                "read": self.call(ins[0], read),
                "init": rule.glsl_init,
                "combine": rule.glsl,
            }
            return r
        # conv and pool families: window geometry as constants
        stride, pad = attrs.get("stride"), attrs.get("padding")
        r |= {"SH": stride[0], "SW": stride[1], "PH": pad[0], "PW": pad[1]}
        op = g.op(n)
        if op == "conv2d":
            x, w = (g.shape(i) for i in ins)
            r |= {"C": x[1], "H": x[2], "W": x[3], "KH": w[2], "KW": w[3]}
            r |= {"x": self.fn(ins[0]), "w": self.fn(ins[1])}
        elif op == "conv2d_input_grad":
            gs, w = (g.shape(i) for i in ins)
            r |= {"O": gs[1], "OH": gs[2], "OW": gs[3], "KH": w[2], "KW": w[3]}
            r |= {"g": self.fn(ins[0]), "w": self.fn(ins[1])}
        elif op == "conv2d_weight_grad":
            x, gs = (g.shape(i) for i in ins)
            r |= {"N": x[0], "H": x[2], "W": x[3], "OH": gs[2], "OW": gs[3]}
            r |= {"x": self.fn(ins[0]), "g": self.fn(ins[1])}
        elif rule.template == "pool":
            x = g.shape(ins[0])
            kh, kw = attrs["kernel"]
            r |= {"H": x[2], "W": x[3], "KH": kh, "KW": kw, "x": self.fn(ins[0])}
            r |= {"init": rule.glsl_init, "combine": rule.glsl, "final": rule.glsl_final}
        elif op == "max_pool2d_grad":
            x, gs = (g.shape(i) for i in ins)
            kh, kw = attrs["kernel"]
            r |= {"H": x[2], "W": x[3], "KH": kh, "KW": kw, "OH": gs[2], "OW": gs[3]}
            r |= {"x": self.fn(ins[0]), "g": self.fn(ins[1])}
        elif op == "avg_pool2d_grad":
            gs = g.shape(ins[0])
            kh, kw = attrs["kernel"]
            r |= {"KH": kh, "KW": kw, "OH": gs[2], "OW": gs[3], "g": self.fn(ins[0])}
        else:
            raise GlcompError(f"no kernel template for op {op!r}")
        return r

    # -- vec4 roots ------------------------------------------------------------------------------
    def _texture(self, n: int, textures: set[int]) -> dict[str, Any] | None:
        """Sampler and geometry of `n` when it is a stored single-page texture of this kernel, or a
        fused reshape of one that keeps the last axis (the same rows, so the same texels)."""
        g = self.graph
        while (
            n not in textures and g.op(n) == "reshape" and g.shape(g.operands(n)[0])[-1:] == g.shape(n)[-1:]
        ):
            n = g.operands(n)[0]
        if n not in textures or self.layouts[n].pages != 1:
            return None
        lay = self.layouts[n]
        return {"s": f"s{n}_0", "w": lay.width, "h": lay.height, "rt": lay.row_texels}

    def _root4_head(self, n: int) -> dict[str, Any]:
        rank = len(self.graph.shape(n))
        lead = [f"i{k}" for k in range(rank - 1)]
        return {
            "params4": ", ".join([f"int {a}" for a in lead] + ["int j0"]),
            "args4": ", ".join([*lead, "j0"]),
            "last": f"i{rank - 1}",
            "row_len": self.graph.shape(n)[-1],
        }

    def root4(self, n: int, textures: set[int]) -> dict[str, Any] | None:
        """What the family template's `root4` macro needs to compute a whole output texel of loop
        node `n` at once, or None when `n` keeps the scalar path. `textures` are the kernel's
        stored leaves (not uniforms): operands among them are read texel-wise."""
        g = self.graph
        if g.op(n) == "conv2d":
            x, w = g.operands(n)
            pw, kw, sw = g.attrs(n)["padding"][1], g.shape(w)[3], g.attrs(n)["stride"][1]
            dmin, dmax = -pw // 4, (3 * sw + kw - 1 - pw) // 4  # x's row texels from SW * x0 / 4 on
            return self._root4_head(n) | {
                "x_tex": self._texture(x, textures),
                "w_tex": self._texture(w, textures),
                "dmin": dmin,
                "D": dmax - dmin + 1,
            }
        if get_op(g.op(n)).kind == "reduce":
            return self._reduce4(n, textures)
        if g.op(n) in ("max_pool2d", "avg_pool2d"):
            (x,) = g.operands(n)
            x_tex = self._texture(x, textures)
            if x_tex is None:
                return None
            pw, kw, sw = g.attrs(n)["padding"][1], g.attrs(n)["kernel"][1], g.attrs(n)["stride"][1]
            dmin, dmax = -pw // 4, (3 * sw + kw - 1 - pw) // 4  # x's row texels from SW * x0 / 4 on
            return self._root4_head(n) | {
                "x_tex": x_tex,
                "C": g.shape(x)[1],
                "dmin": dmin,
                "D": dmax - dmin + 1,
            }
        if g.op(n) == "conv2d_weight_grad":
            x, gs = g.operands(n)
            pw = g.attrs(n)["padding"][1]
            x_tex, g_tex = self._texture(x, textures), self._texture(gs, textures)
            if x_tex is None or g_tex is None:
                return None
            sw = g.attrs(n)["stride"][1]
            dmin, dmax = -pw // 4, (3 * sw + 3 - pw) // 4  # x's row texels from SW * tw + kj0 / 4 on
            return self._root4_head(n) | {
                "x_tex": x_tex,
                "g_tex": g_tex,
                "O": g.shape(gs)[1],
                "C": g.shape(x)[1],
                "dmin": dmin,
                "D": dmax - dmin + 1,
            }
        if g.op(n) == "conv2d_input_grad":
            gs, w = g.operands(n)
            pw, kw = g.attrs(n)["padding"][1], g.shape(w)[3]
            g_tex = self._texture(gs, textures)
            if tuple(g.attrs(n)["stride"]) != (1, 1) or g_tex is None:
                return None
            dmin, dmax = (pw - kw + 1) // 4, (pw + 3) // 4  # texels of g's row around column x0 // 4
            return self._root4_head(n) | {
                "g_tex": g_tex,
                "w_tex": self._texture(w, textures),
                "C": g.shape(n)[1],
                "dmin": dmin,
                "D": dmax - dmin + 1,
            }
        if g.op(n) != "matmul":
            return None
        a, b = g.operands(n)
        spec = self._root4_head(n) | {
            "K": g.shape(a)[1],
            "N": g.shape(b)[1],
            "a": self.fn(a),
            "b": self.fn(b),
            "a_tex": self._texture(a, textures),
            "b_tex": self._texture(b, textures),
            "w_tex": None,
        }
        if spec["b_tex"] is None and g.op(b) == "permute" and tuple(g.attrs(b)["perm"]) == (1, 0):
            spec["w_tex"] = self._texture(g.operands(b)[0], textures)
        return spec

    def _reduce4(self, n: int, textures: set[int]) -> dict[str, Any] | None:
        """root4 of a reduction over a stored single-page input (see reduce.frag.j2): mode "K"
        when the last axis is kept and the reduced axes are one contiguous block, mode "L" when
        the last axis is reduced together with every axis after the first of a trailing block."""
        g = self.graph
        (src,) = g.operands(n)
        tex = self._texture(src, textures)
        shape, axes = g.shape(src), sorted(g.attrs(n)["axes"])
        rank = len(shape)
        if tex is None:
            return None
        row_strides = [math.prod(shape[k + 1 : rank - 1]) for k in range(rank)]  # rows per index step
        head = self._root4_head(n)
        kept = [k for k in range(rank - 1) if k not in axes]
        if rank - 1 not in axes:
            if axes != list(range(axes[0], axes[-1] + 1)):
                return None
            base = " + ".join(f"i{k} * {row_strides[k]}" for k in kept) or "0"
            return head | {
                "mode": "K",
                "x_tex": tex,
                "row_base": base,
                "Q": math.prod(shape[a] for a in axes),
                "step": row_strides[axes[-1]] * tex["rt"],
            }
        first = rank - 1  # the trailing block of reduced axes starts here
        while first - 1 in axes:
            first -= 1
        outer = [a for a in axes if a < first]
        base = " + ".join(f"i{k} * {row_strides[k]}" for k in kept) or "0"
        decompose, terms, stride = [], [], 1
        for a in reversed(outer):
            expr = "qo" if stride == 1 else f"qo / {stride}"
            decompose.insert(0, f"int r{a} = {expr if a == outer[0] else f'imod({expr}, {shape[a]})'};")
            terms.append(f" + r{a} * {row_strides[a]}")
            stride *= shape[a]
        return head | {
            "mode": "L",
            "x_tex": tex,
            "row_base": base,
            "row_outer": "".join(reversed(terms)),
            "decompose": decompose,
            "Qo": math.prod(shape[a] for a in outer),
            "Lc": math.prod(shape[first : rank - 1]) * tex["rt"],
            "rem": shape[-1] % 4,
        }

    def root4t(self, n: int, textures: set[int]) -> dict[str, Any] | None:
        """Like `root4`, for a 2-D loop node read transposed: the macro `root4t` computes the
        column texel (n[j0 + c, i0])_c. Only matmul has one."""
        g = self.graph
        if g.op(n) != "matmul":
            return None
        a, b = g.operands(n)
        spec = {
            "transposed": True,
            "last": "i0",  # the cache is read by the row index
            "args4": "i0, j0",
            "K": g.shape(a)[1],
            "M": g.shape(a)[0],
            "a": self.fn(a),
            "b": self.fn(b),
            "s_tex": None,
            "b_tex": self._texture(b, textures),
        }
        if g.op(a) == "permute" and a not in textures:
            spec["s_tex"] = self._texture(g.operands(a)[0], textures)
        return spec

    def _epilogue_loop(self, root: int, kernel: Kernel) -> tuple[int, str] | None:
        """The fused loop node of a single-root map kernel and how the root reads it: "same" (through
        elementwise ops and reshapes that only add or drop size-1 axes: at the root's own index),
        "transposed" (also through one 2-D transpose: at the swapped index) or "flat" (through
        reshapes: at the same flat index; both last axes multiples of 4, so a texel of the root is
        a texel of the loop node)."""
        g = self.graph
        body = set(kernel.body)

        def view(n: int, state: str | None) -> str | None:
            kind = get_op(g.op(n)).kind
            if state is None or kind == "elementwise":
                return state
            if g.op(n) == "permute" and tuple(g.attrs(n)["perm"]) == (1, 0) and state != "flat":
                return "transposed" if state == "same" else "same"
            if g.op(n) == "reshape" and state in ("same", "flat"):
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
            for src in g.operands(m):
                if src not in body:
                    continue
                if get_op(g.op(src)).kind not in FUSED_ROOT:
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

    # -- whole kernel ----------------------------------------------------------------------------
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
                    "samplers": names,
                }
            )
        functions = [self.leaf_function(leaf, uniform_of) for leaf in kernel.leaves]
        # Fused nodes and elementwise roots (which MRT groups may also read inline), each defined
        # once, in topological order so callees come before callers (rewrites such as transpose
        # push-down create nodes with ids above their readers').
        inline = set(kernel.body) | {r for r in kernel.roots if get_op(g.op(r)).kind in FUSED_ROOT}
        # vec4 roots: a loop root with a root4 form, or a single map root whose only loop node
        # (an epilogue operand read at the root's index) has one.
        textures = {leaf for leaf in kernel.leaves if leaf not in uniform_of}
        roots, cached = [], {}
        for n in kernel.roots:
            spec = self.root(n) | {"template": root_template(g, n)}
            v4 = self.root4(n, textures)
            if v4 is None and len(kernel.roots) == 1 and get_op(g.op(n)).kind in FUSED_ROOT:
                found = self._epilogue_loop(n, kernel)
                cache = None
                if found is not None:
                    loop, how = found
                    cache = self.root4t(loop, textures) if how == "transposed" else self.root4(loop, textures)
                if cache is not None:
                    cached[loop] = cache
                    v4 = self._root4_head(n) | {"caches": [self._cache_call(n, loop, how)]}
            if v4 is not None:
                spec["vec4"] = v4
            roots.append(spec)
        ordered = [self.function(n) for n in sorted(inline, key=self.position.__getitem__)]
        for n, fn in zip(sorted(inline, key=self.position.__getitem__), ordered):
            if n in cached:
                fn["spec"] = fn["spec"] | {"vec4": cached[n]}
            elif get_op(g.op(n)).kind == "reduce":
                # A reduction to one element per row (mode "L") is texel-wise in any context:
                # its scalar function returns the first lane of its root4.
                v4 = self._reduce4(n, textures)
                if v4 is not None and v4["mode"] == "L":
                    lead = [f"i{k}" for k in range(len(g.shape(n)) - 1)]
                    fn["spec"] = fn["spec"] | {"vec4": v4 | {"single": ", ".join([*lead, "0"])}}
        functions += ordered
        outputs = [self._output(r) for r in kernel.roots]
        for o, spec in zip(outputs, roots):
            if "vec4" in spec:
                o |= {"vec4": True, "args4": spec["vec4"]["args4"]}
        context = {
            "webgl1": t.webgl1,
            "kernel_name": kernel.name,
            "node_ids": ", ".join(f"%{n}" for n in [*kernel.body, *kernel.roots]),
            "origins": [safe_comment(o) for o in kernel.origins],
            "outputs": outputs,
            "samplers": [s for s, _, _ in samplers],
            "uniforms": [u for u, _ in uniforms],
            "fetches": fetches,
            "functions": functions,
            "roots": roots,
            "max_loop": t.max_loop_iterations,
            "width": self.layouts[kernel.roots[0]].width,
        }
        source = environment().get_template("_kernel.j2").render(context)
        return Rendered(source, samplers, uniforms)


def vertex_shader(target: Target) -> str:
    """The one vertex shader: a triangle that covers the viewport."""
    return environment().get_template("quad.vert.j2").render(webgl1=target.webgl1)
