"""Lowering a program to a bundle: `lower(ir_program, options)` takes each entry point of a frozen
IR program (glcomp.ir.program.IRProgram) through the passes of glcomp.codegen.pipeline.PIPELINE
(layout, kernel plan, GLSL, memory plan, schedule) into a manifest and its shaders, under typed
compile options (glcomp.codegen.options.CompileOptions) parsed by the caller. Codegen never sees
a glcomp.Program: `build_bundle(program)` is `lower(program.ir, program.compile_options)` with
the program's state and program.json, for callers that hold one.

The bundle format itself (`Bundle`, its name and version, reading, writing and validation) lives
in glcomp.format; `Bundle` and `load_bundle` are re-exported here for callers that import them
from this module. Nothing in a bundle is ever executed as Python.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np

from glcomp.codegen import families
from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.codegen.kernels import Kernel
from glcomp.codegen.layout import Layout, layout_for
from glcomp.codegen.options import OFF_BY_DEFAULT as OPTION_OFF_BY_DEFAULT
from glcomp.codegen.options import PASSES as OPTION_PASSES
from glcomp.codegen.options import STORAGE, CompileOptions
from glcomp.codegen.passes.memplan import Pool
from glcomp.codegen.pipeline import run_pipeline
from glcomp.codegen.programs import merge_origins
from glcomp.codegen.render import KernelRenderer, vertex_shader
from glcomp.codegen.render_cache import Lowered, RenderCache
from glcomp.codegen.target import Target
from glcomp.format import TEXEL_BYTES
from glcomp.format.bundle import FORMAT, VERSION, Bundle, load_bundle
from glcomp.format.manifest import shader_path
from glcomp.format.shaders import shader_loop_bound
from glcomp.ir.gcpause import gc_paused
from glcomp.ir.program import ENTRY_POINTS, IRProgram

# The switchable passes and their defaults live with the typed options (one source); kept here
# under their old names for callers that list them.
PASSES = OPTION_PASSES
OFF_BY_DEFAULT = set(OPTION_OFF_BY_DEFAULT)
__all__ = ["OFF_BY_DEFAULT", "PASSES", "STORAGE", "Bundle", "build_bundle", "load_bundle", "lower"]


class Lowerable(Protocol):
    """What `build_bundle` and `entry_plan` take besides an IRProgram: a glcomp.Program."""

    graphs: dict[str, Any]

    @property
    def ir(self) -> IRProgram: ...

    @property
    def compile_options(self) -> CompileOptions: ...

    lr: float

    def state(self) -> dict[str, Any]: ...

    def to_json(self) -> dict[str, Any]: ...


def options_of(program: Lowerable) -> CompileOptions:
    """The program's compile options, checked and typed (GlcompError naming a bad one)."""
    return program.compile_options


def passes_of(program: Lowerable) -> dict[str, bool]:
    """The code-generation passes in effect: all on unless `passes={...}` switched some off."""
    return dict(program.compile_options.passes)


# Texel formats of temporary textures (compile option ``storage=``, see options.STORAGE). A
# texture record in the manifest carries ``"format": "f16"`` when it is RGBA16F; without the field
# it is RGBA32F, so bundles compiled with the default ``storage="f32"`` are byte for byte what
# they were before the option existed. Shaders compute in highp (float32) registers either way:
# only what a texel holds between draws is rounded to half precision.
def storage_of(program: Lowerable) -> str:
    """The ``storage=`` option in effect ("f32" unless given)."""
    return program.compile_options.storage


def wide_kernels(plan: KernelPlan) -> set[str]:
    """The kernels of `plan` computing a value of an op in glcomp.codegen.families.WIDE_OPS
    (texture_formats keeps their targets float32)."""
    g = plan.graph
    return {k.name for k in plan.kernels if any(g.op(r) in families.WIDE_OPS for r in k.roots)}


def texture_formats(
    entries: dict[str, Any],
    temporaries: set[str],
    storage: str,
    wide_draws: dict[str, set[str]] | None = None,
) -> dict[str, str]:
    """The format of each temporary texture under `storage` ("rgba8": every one, as the states).

    With "f16", a temporary is RGBA16F unless it must hold float32: it carries an entry's input
    (class ids and token ids above 2048 are not exact in half precision), it holds the loss an
    entry reads back (a sum loss beyond 65504 would read as inf, and ``train_steps`` would call a
    finite step divergent), or a draw renders to it together with a float32 texture (WebGL 1's
    WEBGL_draw_buffers does not promise render targets of mixed formats; states are float32, so
    a draw that also writes a state writes float32 everywhere). Other read-back outputs
    (predictions, gradients) are RGBA16F and read back widened to float32. Parameters and
    optimizer moments stay float32 because updates far smaller than the value (lr * grad against
    a weight; Adam's second moment of gradients around 1e-4) vanish when rounded to 11
    significant bits. A draw of a kernel named in `wide_draws` (entry -> kernel names: those
    computing a logsumexp, `wide_kernels`) renders float32 too."""
    if storage in ("f32", "rgba8"):
        return dict.fromkeys(temporaries, storage)
    wide: set[str] = set()
    for name, e in entries.items():
        kept = (wide_draws or {}).get(name, set())
        wide |= {r for d in e["draws"] if d["kernel"] in kept for r in d["targets"] if isinstance(r, str)}
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


def target_of(program: Lowerable) -> Target:
    """The target the program is compiled for, with its limits."""
    return program.compile_options.make_target()


def entry_plan(
    program: IRProgram | Lowerable, entry: str, options: CompileOptions | None = None
) -> KernelPlan:
    """The plan of `entry` before any pass: its IR graph, the target and the pass switches of
    `options`, and the names of its persistent states. `program` is an IRProgram with its
    `options`, or a glcomp.Program (its `ir` and `compile_options`)."""
    if not isinstance(program, IRProgram):
        program, options = program.ir, program.compile_options
    if options is None:
        raise TypeError("entry_plan(ir_program, entry, options): the options are missing")
    states = frozenset(program.states)
    target = options.planning_target()
    graph = program.graphs[entry]
    if options.inspect:  # the tensors to keep readable: extra outputs, nothing else changes
        from glcomp.ir.names import check_inspect_names, keep_for_inspect

        nodes = check_inspect_names(program.graphs, options.inspect, states)
        graph = keep_for_inspect(graph, nodes[entry], options.inspect)
    return KernelPlan(entry, graph, target, options.passes, states, options.storage)


def build_bundle(program: Lowerable, dump_after: str | None = None, check: bool = False) -> Bundle:
    """`lower` for a glcomp.Program: its IR program under its compile options, holding its
    current state and learning rate, with its program.json."""
    bundle = lower(program.ir, program.compile_options, dump_after=dump_after, check=check)
    return dataclasses.replace(bundle.with_state(program.state(), program.lr), program=program.to_json())


def lower(
    ir: IRProgram, options: CompileOptions, *, dump_after: str | None = None, check: bool = False
) -> Bundle:
    """Lower every entry point of `ir` to shaders and draw schedules under `options`, through
    the passes of glcomp.codegen.pipeline.PIPELINE. The bundle's state is zeros (counters 0, lr
    0) and it has no program.json: `Bundle.with_state` gives it its values. `dump_after` names a
    pass: the kernel plan of each entry point is printed after it (GlcompError listing the passes
    for an unknown name). With `check`, glcomp.codegen.kernel_plan.check_plan checks the plan
    after every pass."""
    with gc_paused():  # see glcomp.ir.gcpause
        return _lower(ir, options, dump_after, check)


def _lower(program: IRProgram, options: CompileOptions, dump_after: str | None, check: bool) -> Bundle:
    target = options.planning_target()  # rgba8: a quarter of the device's texture size
    size = target.max_texture_size
    pool = Pool()
    programs: dict[str, dict[str, Any]] = {}
    shaders: dict[str, str] = {"quad.vert": vertex_shader(target)}
    by_source: dict[str, str] = {}
    cache = RenderCache()

    # Persistent state: parameters, float buffers and optimizer state, two texture sets each
    # (ping-pong: an update reads one set and writes the other).
    states: dict[str, dict[str, Any]] = {}
    for i, (name, spec) in enumerate(program.states.items()):
        lay = layout_for(spec.shape, size)
        sets = [[f"state{i}{v}{p}" for p in range(lay.pages)] for v in "ab"]
        states[name] = {"role": spec.role, "layout": lay.to_json(), "textures": sets}
    state_sizes = {
        t: (st["layout"]["width"], st["layout"]["height"])
        for st in states.values()
        for group in st["textures"]
        for t in group
    }

    entries: dict[str, Any] = {}
    wide: dict[str, set[str]] = {}
    for entry in ENTRY_POINTS:
        if entry in program.graphs:
            plan = run_pipeline(entry_plan(program, entry, options), dump_after, check)
            entries[entry] = _emit_entry(plan, pool, programs, shaders, by_source, cache)
            wide[entry] = wide_kernels(plan)

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
    for name, fmt in texture_formats(entries, set(textures), options.storage, wide).items():
        if fmt != "f32":  # no field means RGBA32F: f32 manifests stay as they were
            textures[name]["format"] = fmt
    state_format = {"format": "rgba8"} if options.storage == "rgba8" else {}  # else states are RGBA32F
    textures |= {name: {"width": w, "height": h} | state_format for name, (w, h) in state_sizes.items()}
    peak = sum(TEXEL_BYTES[t.get("format", "f32")] * t["width"] * t["height"] for t in textures.values())
    inputs = {}
    for entry in entries:
        for name, spec in program.input_specs(entry).items():
            inputs[name] = spec.to_json() | {"layout": layout_for(spec.shape, size).to_json()}
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "target": options.make_target().to_json(),  # the device's limits
        "inputs": inputs,
        "hyper": {"lr": 0.0},
        "states": states,
        "counters": dict.fromkeys(program.counters, 0),
        "textures": textures,
        "vertex_shader": "quad.vert",
        "programs": programs,
        "entries": entries,
        "memory": {"texture_bytes": peak, "textures": len(textures)},
        "passes": {k: bool(v) for k, v in sorted(options.passes.items())},
    }
    weights = {k: np.zeros(spec.shape, np.float32) for k, spec in program.states.items()}
    weights |= {k: np.zeros((), np.int64) for k in program.counters}
    return Bundle(manifest, shaders, weights)


def _emit_entry(
    plan: KernelPlan,
    pool: Pool,
    programs: dict[str, Any],
    shaders: dict[str, str],
    by_source: dict[str, str],
    cache: RenderCache | None = None,
) -> dict[str, Any]:
    """An entry point's manifest record from its final plan: textures named from the shared
    `pool`, each kernel rendered (programs shared by identical sources; kernels that differ from
    one lowered before only in node ids are rendered once, through `cache`), its draws listed."""
    cache = cache or RenderCache()
    graph, layouts = plan.graph, plan.layouts
    hypers = plan.hypers()
    renderer = KernelRenderer(graph, dict(layouts), plan.target, rgba8=plan.storage == "rgba8")
    renderer.from_tiles = {n: plan.tilings[name] for n, name in plan.from_tiles.items()}
    state_in, state_out = plan.state_in(), plan.state_out()
    temps = {v: [pool.texture(size, index) for size, index in slots] for v, slots in plan.memory.items()}

    def ref(n: int, page: int) -> Any:
        if n in state_in:
            return {"state": state_in[n], "version": "cur", "page": page}
        if n in state_out:
            return {"state": state_out[n], "version": "next", "page": page}
        return temps[n][page]

    draws = []
    size = plan.target.max_texture_size
    for kernel in plan.kernels:
        t = plan.tilings.get(kernel.name)
        if t is None:
            lowered = cache.lower(renderer, plan, kernel, hypers)
            parts = [(lowered, plan.written(kernel), layouts[kernel.roots[0]])]
        else:  # a register-blocked draw into tiles, then a gather draw (families matmul, conv)
            block, gather = cache.lower_tiled(kernel, t, layouts, plan.target)
            parts = [(block, t.tiles, t.tile_layout(size))]
            if t.node not in plan.from_tiles:  # else its one reader gathers as it reads
                parts.append((gather, plan.written(kernel), layouts[t.node]))
        draws += _draws(kernel, parts, ref, plan.blended, programs, shaders, by_source)
    return {
        "inputs": {name: [ref(n, p) for p in range(layouts[n].pages)] for name, n in plan.data_in().items()},
        "outputs": {
            name: {"layout": layouts[n].to_json(), "textures": [ref(n, p) for p in range(layouts[n].pages)]}
            for name, n in plan.readback().items()
        },
        "updates": sorted(set(state_out.values())),
        "draws": draws,
    }


def _draws(
    kernel: Kernel,
    parts: list[tuple[Lowered, list[int], Layout]],
    ref: Any,
    blended: frozenset[str],
    programs: dict[str, Any],
    shaders: dict[str, str],
    by_source: dict[str, str],
) -> list[dict[str, Any]]:
    """The draws of one kernel: for each (lowered shader, values written, footprint) part, its
    program (shared with any kernel of the same canonical source) drawn once per page."""
    draws = []
    for rendered, targets, out in parts:
        # Kernels that differ only in node ids (each step of a recurrence) share one program.
        source, samplers, offsets = rendered.source, rendered.samplers, rendered.offsets
        digest = rendered.digest
        if digest in by_source:  # shared: the program's shader also names this kernel's origins
            fragment = f"{by_source[digest]}.frag"
            shaders[fragment] = merge_origins(shaders[fragment], source)
        else:
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
                "loop_iterations": shader_loop_bound(source, shader_path(VERSION, f"{pid}.frag")),
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
                    "blend": kernel.name in blended,
                    "viewport": [out.width, out.height],
                }
            )
    return draws
