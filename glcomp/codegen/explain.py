"""`explain`: where a bundle's time goes, read from its manifest and shaders before profiling.

Each draw is listed with its kernel, program, render targets, viewport and an estimate of its
work in one unit: fragment invocations times the loop iterations each runs (the upper bound the
compiler records per program and the loaders check), a fragment without loops counting as 1.
On every GPU measured so far (llvmpipe, SwiftShader, an NVIDIA H200) the loop kernels took
almost all of a training step, so the largest estimates are where to look first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from glcomp.errors import GlcompError

if TYPE_CHECKING:
    from glcomp.codegen.bundle import Lowerable


def _origins(source: str) -> str:
    found = [line[8:].strip() for line in source.splitlines() if line.startswith("// from ")]
    return ", ".join(dict.fromkeys(found)) or "-"


def draw_costs(manifest: dict[str, Any], entry: str) -> list[int]:
    """Estimated work of each draw of `entry`: viewport texels x max(1, loop iterations per texel)."""
    programs = manifest["programs"]
    costs = []
    for d in manifest["entries"][entry]["draws"]:
        w, h = d["viewport"]
        costs.append(w * h * max(1, int(programs[d["program"]].get("loop_iterations", 1))))
    return costs


def explain(manifest: dict[str, Any], shaders: dict[str, str]) -> str:
    """A plain-text report: per entry point its draws (largest estimated work first), programs and
    totals, then the texture memory."""
    lines = []
    programs = manifest["programs"]
    for entry, e in manifest["entries"].items():
        draws = e["draws"]
        costs = draw_costs(manifest, entry)
        total = max(1, sum(costs))
        used = {d["program"] for d in draws}
        lines.append(
            f"{entry}: {len(draws)} draws, {len(used)} programs, "
            f"estimated work {sum(costs):,} texel-loop iterations"
        )
        lines.append(
            f"  {'#':>3}  {'kernel':<28} {'prog':<6} {'tgt':>3} {'viewport':>10} "
            f"{'loop/texel':>10} {'est. work':>14} {'share':>6}  from"
        )
        order = sorted(range(len(draws)), key=lambda i: (-costs[i], i))
        for i in order:
            d = draws[i]
            p = programs[d["program"]]
            w, h = d["viewport"]
            src = shaders.get(p["fragment"], "")
            blend = " +blend" if d.get("blend") else ""
            lines.append(
                f"  {i:>3}  {d['kernel'][:28]:<28} {d['program']:<6} {len(d['targets']):>3} "
                f"{f'{w}x{h}':>10} {int(p.get('loop_iterations', 0)):>10} {costs[i]:>14,} "
                f"{100 * costs[i] / total:>5.1f}%  {_origins(src)}{blend}"
            )
    mem = manifest["memory"]
    lines.append(
        f"textures: {mem['textures']} ({mem['texture_bytes']:,} bytes); "
        f"programs in the bundle: {len(programs)}"
    )
    return "\n".join(lines)


def plans_after(program: Lowerable, name: str) -> str:
    """Each entry point's kernel plan after the pass `name` (``str(plan)``, one block per entry
    point in the order of the bundle's entries): the passes after it do not run, so a plan that
    a later pass would refuse is still shown. GlcompError listing the passes for an unknown name,
    or for a program without IR graphs (a bundle saved without program.json)."""
    from glcomp.codegen.bundle import entry_plan
    from glcomp.codegen.pipeline import check_pass_name, run_pipeline
    from glcomp.ir.gcpause import gc_paused
    from glcomp.ir.program import ENTRY_POINTS

    check_pass_name(name, "dump_after")
    if not program.graphs:
        raise GlcompError(
            "this program was loaded from a bundle without IR graphs (no program.json): "
            "it has no kernel plans to dump"
        )
    out: list[str] = []
    with gc_paused():  # see glcomp.ir.gcpause
        for entry in ENTRY_POINTS:
            if entry in program.graphs:
                run_pipeline(entry_plan(program, entry), dump_after=name, dump=out.append, until=name)
    return "\n".join(out)
