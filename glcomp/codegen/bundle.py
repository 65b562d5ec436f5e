"""Bundles: a compiled program as data (manifest.json, shaders/*.glsl, weights.safetensors).

`build_bundle` lowers each entry point of a Program (layout, kernel plan, GLSL, memory plan,
schedule); `Bundle.save` writes it and `load_bundle` reads one back, validating it against the
schema in glcomp/codegen/schema.py. Nothing in a bundle is ever executed as Python.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from glcomp.codegen.blend import BlendPlan, blend_accumulation
from glcomp.codegen.layout import Layout, layout_for
from glcomp.codegen.memplan import Pool, plan_memory
from glcomp.codegen.mrt import mrt_fusion
from glcomp.codegen.plan import Kernel, plan_kernels
from glcomp.codegen.programs import canonical
from glcomp.codegen.render import KernelRenderer, vertex_shader
from glcomp.codegen.schema import TEXEL_BYTES, shader_loop_bound
from glcomp.codegen.split_wide import split_wide
from glcomp.codegen.target import Target, make_target
from glcomp.codegen.tiled import choose_tiling, render_tiled, split_epilogues
from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op
from glcomp.ir.passes import fold_views, split_reductions, split_weight_grads, transpose_pushdown
from glcomp.ir.tensor import Tensor
from glcomp.program import ENTRY_POINTS, Program

FORMAT = "glcomp-bundle"
VERSION = 2
TARGET_LIMITS = ("max_texture_size", "max_draw_buffers", "max_texture_units", "max_loop_iterations")


@dataclass
class Bundle:
    manifest: dict[str, Any]
    shaders: dict[str, str]  # file name under shaders/ -> source
    weights: dict[str, np.ndarray]
    # program.json: the IR graphs and what `glcomp.load` needs to rebuild the Program (plain
    # JSON data, see Program.to_json); None for bundles built by hand.
    program: dict[str, Any] | None = None

    def save(self, directory: str | Path) -> Path:
        """Write the bundle to `directory` atomically (see glcomp.codegen.schema.write_bundle):
        a bundle already there is replaced as a whole, other files beside it are kept, and a
        failed save leaves the previous bundle as it was. Returns the directory."""
        from glcomp.codegen.schema import write_bundle

        return write_bundle(self, Path(directory))

    def with_state(self, weights: dict[str, Any], lr: float) -> Bundle:
        """The same bundle holding other state: `weights` must hold every state and counter
        of this bundle in its shape (extra names are an error); `lr` is the learning rate."""
        states, counters = self.manifest["states"], self.manifest["counters"]
        want = {k: tuple(st["layout"]["shape"]) for k, st in states.items()} | {k: () for k in counters}
        if set(weights) != set(want):
            raise GlcompError(
                f"bundle state: missing {sorted(set(want) - set(weights))}, "
                f"unexpected {sorted(set(weights) - set(want))}"
            )
        new: dict[str, np.ndarray] = {}
        for k, shape in want.items():
            value = np.asarray(weights[k])
            if value.shape != shape:
                raise GlcompError(f"bundle state: {k!r} has shape {value.shape}, expected {shape}")
            new[k] = value.astype(np.int64 if k in counters else np.float32)
        manifest = dict(self.manifest)
        manifest["hyper"] = {**self.manifest["hyper"], "lr": float(lr)}
        manifest["counters"] = {k: int(new[k]) for k in counters}
        return Bundle(manifest, dict(self.shaders), new, self.program)


def _state_outputs(graph: Graph) -> dict[str, str]:
    """Output name -> state name for the values an entry point writes back."""
    out = {}
    for key in graph.outputs:
        kind, _, name = key.partition(":")
        if kind in ("param", "buffer", "state"):
            out[key] = name
    return out


def _isolate_state_outputs(graph: Graph) -> Graph:
    """Give every written-back state a node of its own (a state's new texture must not be an
    input texture or shared with another output), inserting identity copies where needed."""
    g = graph.copy()
    seen: set[int] = set()
    for key in _state_outputs(g):
        n = g.outputs[key]
        if get_op(g.op(n)).feed or n in seen:
            g.outputs[key] = Tensor(g, n).detach().node
        seen.add(g.outputs[key])
    return g


PASSES = {
    "fusion": "fuse elementwise, movement and index ops into the kernels that read them",
    "epilogue": "run a loop kernel (matmul, conv, reduce, pool) inside the elementwise kernel "
    "that alone reads it",
    "mrt": "write results of consecutive kernels that share inputs from one draw call",
    "memplan": "reuse temporary textures by liveness",
    "pushdown": "push transposes below matmuls and sums (IR rewrite)",
    "blend": "accumulate sums of kernel results with additive blending (float-blend targets)",
    "fold_views": "fold transposes of transposes and reshapes of reshapes (IR rewrite, exact)",
    "split_reductions": "reduce long sums and maxima with few outputs in two parallel stages (IR rewrite)",
    "split_weight_grads": "compute long convolution weight gradients as parallel partial sums over batch "
    "chunks (IR rewrite)",
}


# Measured on the test LSTM: pushing transposes down costs more draws than MRT fusion saves
# there, so it is opt-in (it is what lets blending accumulate transposed weight gradients).
OFF_BY_DEFAULT = {"pushdown"}


def passes_of(program: Program) -> dict[str, bool]:
    """The code-generation passes in effect: all on unless `passes={...}` switched some off."""
    given = program.options.get("passes") or {}
    unknown = set(given) - set(PASSES)
    if unknown:
        raise GlcompError(f"unknown passes {sorted(unknown)}; known: {sorted(PASSES)}")
    return {name: bool(given.get(name, name not in OFF_BY_DEFAULT)) for name in PASSES}


# Texel formats of temporary textures (compile option ``storage=``). A texture record in the
# manifest carries ``"format": "f16"`` when it is RGBA16F; without the field it is RGBA32F, so
# bundles compiled with the default ``storage="f32"`` are byte for byte what they were before the
# option existed. Shaders compute in highp (float32) registers either way: only what a texel
# holds between draws is rounded to half precision.
STORAGE = {
    "f32": "RGBA32F textures everywhere (the default)",
    "f16": "RGBA16F temporaries (activations, gradients): half their texture memory and bandwidth; "
    "states (parameters, buffers, optimizer moments), entry inputs and the loss stay RGBA32F",
}


def storage_of(program: Program) -> str:
    """The ``storage=`` option in effect ("f32" unless given)."""
    storage = program.options.get("storage", "f32")
    if storage not in STORAGE:
        raise GlcompError(f"storage must be one of {list(STORAGE)}, got {storage!r}")
    return str(storage)


def texture_formats(entries: dict[str, Any], temporaries: set[str], storage: str) -> dict[str, str]:
    """The format of each temporary texture under `storage`.

    With "f16", a temporary is RGBA16F unless it must hold float32: it carries an entry's input
    (class ids and token ids above 2048 are not exact in half precision), it holds the loss an
    entry reads back (a sum loss beyond 65504 would read as inf, and ``train_steps`` would call a
    finite step divergent), or a draw renders to it together with a float32 texture (WebGL 1's
    WEBGL_draw_buffers does not promise render targets of mixed formats; states are float32, so
    a draw that also writes a state writes float32 everywhere). Other read-back outputs
    (predictions, gradients) are RGBA16F and read back widened to float32. Parameters and
    optimizer moments stay float32 because updates far smaller than the value (lr * grad against
    a weight; Adam's second moment of gradients around 1e-4) vanish when rounded to 11
    significant bits."""
    if storage == "f32":
        return dict.fromkeys(temporaries, "f32")
    wide: set[str] = set()
    for e in entries.values():
        wide |= {r for refs in e["inputs"].values() for r in refs if isinstance(r, str)}
        wide |= {r for r in e["outputs"].get("loss", {}).get("textures", []) if isinstance(r, str)}
    groups = [d["targets"] for e in entries.values() for d in e["draws"]]
    changed = True
    while changed:  # a promoted texture can promote the co-targets of its other draws
        changed = False
        for targets in groups:
            if any(not isinstance(r, str) or r in wide for r in targets):
                new = {r for r in targets if isinstance(r, str)} - wide
                if new:
                    wide |= new
                    changed = True
    return {t: "f32" if t in wide else storage for t in temporaries}


def target_of(program: Program) -> Target:
    limits = {k: program.options[k] for k in TARGET_LIMITS + ("float_blend",) if k in program.options}
    return make_target(program.options.get("target", "webgl2"), **limits)


def build_bundle(program: Program) -> Bundle:
    """Lower every entry point of `program` to shaders and draw schedules."""
    target = target_of(program)
    size = target.max_texture_size
    pool = Pool()
    programs: dict[str, dict[str, Any]] = {}
    shaders: dict[str, str] = {"quad.vert": vertex_shader(target)}
    by_source: dict[str, str] = {}

    # Persistent state: parameters, float buffers and optimizer state, two texture sets each
    # (ping-pong: an update reads one set and writes the other).
    states: dict[str, dict[str, Any]] = {}
    init = {**program.params, **program.buffers, **program.opt_state}
    roles = {k: "param" for k in program.params} | {k: "buffer" for k in program.buffers}
    roles |= {k: "state" for k in program.opt_state}
    for i, (name, value) in enumerate(init.items()):
        lay = layout_for(tuple(value.shape), size)
        sets = [[f"state{i}{v}{p}" for p in range(lay.pages)] for v in "ab"]
        states[name] = {"role": roles[name], "layout": lay.to_json(), "textures": sets}
    state_sizes = {
        t: (st["layout"]["width"], st["layout"]["height"])
        for st in states.values()
        for group in st["textures"]
        for t in group
    }

    entries: dict[str, Any] = {}
    for entry in ENTRY_POINTS:
        if entry in program.graphs:
            entries[entry] = _lower_entry(
                entry,
                program,
                program.graphs[entry],
                target,
                pool,
                programs,
                shaders,
                by_source,
                states,
            )

    # Only textures some draw, input or output names: loaders refuse a bundle declaring others
    # (a pool texture can lose its last use when draws are merged into blended ones).
    named = {
        ref
        for e in entries.values()
        for refs in [
            *e["inputs"].values(),
            *(o["textures"] for o in e["outputs"].values()),
            *(list(d["samplers"].values()) + d["targets"] for d in e["draws"]),
        ]
        for ref in refs
        if isinstance(ref, str)
    }
    textures = {name: {"width": w, "height": h} for name, (w, h) in pool.sizes().items() if name in named}
    for name, fmt in texture_formats(entries, set(textures), storage_of(program)).items():
        if fmt != "f32":  # no field means RGBA32F: f32 manifests stay as they were
            textures[name]["format"] = fmt
    textures |= {name: {"width": w, "height": h} for name, (w, h) in state_sizes.items()}
    peak = sum(TEXEL_BYTES[t.get("format", "f32")] * t["width"] * t["height"] for t in textures.values())
    inputs = {}
    for entry in entries:
        for name, spec in program.input_specs(entry).items():
            inputs[name] = spec.to_json() | {"layout": layout_for(spec.shape, size).to_json()}
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "target": target.to_json(),
        "inputs": inputs,
        "hyper": {"lr": program.lr},
        "states": states,
        "counters": {k: int(v) for k, v in program.counters.items()},
        "textures": textures,
        "vertex_shader": "quad.vert",
        "programs": programs,
        "entries": entries,
        "memory": {"texture_bytes": peak, "textures": len(textures)},
        "passes": {k: bool(v) for k, v in sorted(passes_of(program).items())},
    }
    weights = {k: np.asarray(v, np.float32) for k, v in init.items()}
    weights |= {k: np.asarray(v, np.int64) for k, v in program.counters.items()}
    return Bundle(manifest, shaders, weights, program.to_json())


def _lower_entry(
    entry: str,
    program: Program,
    graph: Graph,
    target: Target,
    pool: Pool,
    programs: dict[str, Any],
    shaders: dict[str, str],
    by_source: dict[str, str],
    states: dict[str, Any],
) -> dict[str, Any]:
    size = target.max_texture_size
    passes = passes_of(program)
    # IR rewrites first; then a written-back state must not alias an input or another output.
    if passes["pushdown"]:
        graph = transpose_pushdown(graph)
    if passes["fold_views"]:  # so loop kernels see stored operands behind double transposes
        graph = fold_views(graph)
    if passes["split_reductions"]:  # before planning: each stage becomes a kernel of its own
        graph = split_reductions(graph)
    if passes["split_weight_grads"]:  # before planning: each part becomes a kernel of its own
        graph = split_weight_grads(graph)
    graph = _isolate_state_outputs(split_wide(graph, target))
    layouts: dict[int, Layout] = {n: layout_for(graph.shape(n), size) for n in graph.nodes()}
    pages = {n: lay.pages for n, lay in layouts.items()}
    kernels, stored = plan_kernels(graph, target, pages, passes["fusion"], passes["epilogue"])
    hypers = {n: graph.attrs(n)["name"] for n in graph.inputs.values() if graph.attrs(n)["role"] == "hyper"}
    renderer = KernelRenderer(graph, layouts, target)

    # Where each stored value lives: a state texture set, or a temporary from the pool.
    state_in = {n: graph.attrs(n)["name"] for n in graph.inputs.values() if graph.attrs(n)["name"] in states}
    state_out = {graph.outputs[k]: name for k, name in _state_outputs(graph).items()}
    data_in = {
        graph.attrs(n)["name"]: n
        for n in graph.inputs.values()
        if graph.attrs(n)["role"] in ("data", "target")
    }
    readback = {k: n for k, n in graph.outputs.items() if k not in _state_outputs(graph)}

    if passes["mrt"]:
        kernels = mrt_fusion(kernels, graph, layouts, target, fixed=set(state_out))

    blends = BlendPlan()
    if passes["blend"] and target.float_blend:
        kernels, blends = blend_accumulation(kernels, graph, layouts)

    def written(k: Kernel) -> list[int]:
        return [blends.into.get(r, r) for r in k.roots]

    # Large matmuls run as a register-blocked draw into tiles plus a gather draw (see tiled.py).
    kernels, products = split_epilogues(kernels, graph, layouts, target, keep=set(blends.blend))
    stored |= products
    tiling = {k.name: choose_tiling(graph, k, layouts, target) for k in kernels if k.name not in blends.blend}
    tilings = {name: t for name, t in tiling.items() if t is not None}
    steps = []
    for k in kernels:
        t = tilings.get(k.name)
        steps += [(t.tiles, k.leaves), (written(k), t.tiles)] if t else [(written(k), k.leaves)]
    temp_sizes = {
        n: [(layouts[n].width, layouts[n].height)] * layouts[n].pages
        for n in stored
        if n not in state_in and n not in state_out and n not in hypers
    }
    for t in tilings.values():
        lay = t.tile_layout(size)
        temp_sizes |= {tile: [(lay.width, lay.height)] for tile in t.tiles}
    reuse = passes["memplan"]
    temps = plan_memory(steps, temp_sizes, set(readback.values()), pool, reuse)

    def ref(n: int, page: int) -> Any:
        if n in state_in:
            return {"state": state_in[n], "version": "cur", "page": page}
        if n in state_out:
            return {"state": state_out[n], "version": "next", "page": page}
        return temps[n][page]

    draws = []
    for kernel in kernels:
        t = tilings.get(kernel.name)
        if t is None:
            parts = [(renderer.render(kernel, hypers), written(kernel), layouts[kernel.roots[0]])]
        else:
            block, gather = render_tiled(t, kernel, layouts, target)
            parts = [(block, t.tiles, t.tile_layout(size)), (gather, written(kernel), layouts[t.node])]
        draws += _draws(kernel, parts, ref, blends, programs, shaders, by_source)
    return {
        "inputs": {name: [ref(n, p) for p in range(layouts[n].pages)] for name, n in data_in.items()},
        "outputs": {
            name: {"layout": layouts[n].to_json(), "textures": [ref(n, p) for p in range(layouts[n].pages)]}
            for name, n in readback.items()
        },
        "updates": sorted(set(state_out.values())),
        "draws": draws,
    }


def _draws(
    kernel: Kernel,
    parts: list[tuple[Any, list[int], Layout]],
    ref: Any,
    blends: BlendPlan,
    programs: dict[str, Any],
    shaders: dict[str, str],
    by_source: dict[str, str],
) -> list[dict[str, Any]]:
    """The draws of one kernel: for each (rendered shader, values written, footprint) part, its
    program (shared with any kernel of the same canonical source) drawn once per page."""
    draws = []
    for rendered, targets, out in parts:
        # Kernels that differ only in node ids (each step of a recurrence) share one program.
        source, renamed, offsets = canonical(rendered.source)
        samplers = [(renamed.get(s, s), n, p) for s, n, p in rendered.samplers]
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        if digest not in by_source:
            pid = f"p{len(programs)}"
            by_source[digest] = pid
            shaders[f"{pid}.frag"] = source
            programs[pid] = {
                "fragment": f"{pid}.frag",
                "samplers": [s for s, _, _ in samplers],
                "uniforms": [u for u, _ in rendered.uniforms] + list(offsets),
                "outputs": len(targets),
                # An upper bound of the loop iterations per fragment, by the analysis loaders
                # check shaders with (they refuse a shader whose loops may run longer).
                "loop_iterations": shader_loop_bound(source, f"shaders/{pid}.frag"),
            }
        pid = by_source[digest]
        for page in range(out.pages):
            draws.append(
                {
                    "kernel": kernel.name,
                    "program": pid,
                    "samplers": {s: ref(n, p) for s, n, p in samplers},
                    "uniforms": {u: {"hyper": h} for u, h in rendered.uniforms}
                    | {u: {"int": v} for u, v in offsets.items()},
                    "page_offset": page * out.page_texels,
                    "targets": [ref(r, page) for r in targets],
                    "blend": kernel.name in blends.blend,
                    "viewport": [out.width, out.height],
                }
            )
    return draws


def load_bundle(directory: str | Path) -> Bundle:
    """Read and validate a bundle directory; raises GlcompError naming the fault."""
    from glcomp.codegen.schema import read_bundle

    return read_bundle(Path(directory))
