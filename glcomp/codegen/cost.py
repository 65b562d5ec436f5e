"""The code generator's one cost model, in one unit: the element-iteration.

One *element-iteration* is one iteration of a kernel loop for one output element: a texel fetch
shared by the texel's four elements and a multiply-add (a vec4 kernel's loop iteration over a
whole texel counts 4; one texel fetch counts `FETCH`). A fused elementwise op evaluated once per
element costs its `Op.cost` (1; transcendentals and division 2; views 0). A draw call's fixed
cost (binding its program, framebuffer and textures, one pass over the viewport) is `DRAW`.

Every decision that trades shader work against draws or textures uses these numbers:

- fusion (glcomp.codegen.passes.fusion): a fused operand of a matmul or convolution is recomputed at every
  read while it costs at most `RECOMPUTE` ops per read, else it is stored;
- MRT (glcomp.codegen.passes.mrt): kernels merge into one draw when the work added by the common
  footprint costs less than the `DRAW` saved;
- tiling (glcomp.codegen.passes.tiling): a matmul runs register-blocked when the fetches it saves, at
  `FETCH` each, exceed its gather pass and `BLOCKED_DRAW` per draw it adds; on a target that names
  the fragments a draw needs (`Target.parallel_fragments`), each draw's fetches also count
  `occupancy` times, so a product short of fragments splits its K over more of them.

Calibration. benchmarks/calibrate.py times a loop kernel over 256x256 texels for two loop lengths
and chains of 1x1 draws that switch program, target and texture: on Mesa llvmpipe (2 vCPUs of an
AMD EPYC, 2026-11-30) 0.50-0.63 ns per element-iteration and 31-59 us per isolated draw, i.e.
62,000-94,000 element-iterations. Whole training steps say less: with `DRAW` = 65,536 MRT merged
more (LSTM 104 -> 82 draws per step, CNN 36 -> 32) and the steps ran no faster (LSTM 74 -> 86
ms, CNN 13.2 -> 13.8 ms; benchmarks/bench.py, GL runtime, same machine and hour, load 3.7-4.5),
so `DRAW` stays at the 20,000 those measurements favour. A register-blocked draw (up to 8 render
targets) and its gather draw cost more than a plain draw on CPU rasterizers: `BLOCKED_DRAW` is
2^16 element-iterations. It was 2^20 (tiling every matmul that the fetch count alone favoured
had made the MLP and conv_seed steps 10-25% slower on llvmpipe, before tiles were read by their
epilogues without a gather); with 2^16, the kernels of 2026-12-04, char-GPT (bench.py's gpt)
ran 166 ms a step in SwiftShader against 181 (8 rounds interleaved in one headless Chromium) and
the same on llvmpipe, the MLP 5.6 against 6.5 ms in SwiftShader and 4.1 against 4.6 on llvmpipe,
the CNN the same on both (benchmarks/RESULTS.md). On an NVIDIA H200
calibrate.py gives 0.012 ns per element-iteration and 12 us per draw, about 1,030,000: these
constants suit CPU rasterizers and browsers. A target may carry its own (Target.draw_cost,
Target.blocked_draw_cost; the ``webgl2-gpu`` preset has the H200's), which every decision below
then uses.
"""

from __future__ import annotations

from typing import Any

DRAW = 20_000  # element-iterations one draw call costs
BLOCKED_DRAW = 1 << 16  # element-iterations a register-blocked draw or its gather draw costs
FETCH = 4  # element-iterations one texel fetch counts (a texel holds four elements)
RECOMPUTE = 2  # ops of fused arithmetic a loop kernel may recompute at each read of an operand
GATHER_FETCHES = 2  # texel fetches a tiled kernel's gather draw spends per output texel (read, write)


def draws(count: int, blocked: bool = False, target: Any = None) -> int:
    """The cost of `count` draw calls (register-blocked ones and their gathers with `blocked`):
    the constants of `target` (a glcomp.codegen.target.Target) where it has its own, else DRAW
    and BLOCKED_DRAW."""
    own = None if target is None else (target.blocked_draw_cost if blocked else target.draw_cost)
    if own is not None:
        return count * own
    return count * (BLOCKED_DRAW if blocked else DRAW)


def occupancy(fragments: int, target: Any = None) -> float:
    """How much longer a draw over `fragments` fragments takes than its work alone says: a
    device that needs `target.parallel_fragments` fragments to keep busy runs fewer no faster
    (1 when the target names no such width, as on CPU rasterizers, or the draw has as many)."""
    width = None if target is None else target.parallel_fragments
    if width is None or fragments >= width:
        return 1.0
    return width / max(1, fragments)


def fetches(count: float) -> float:
    """The cost of `count` texel fetches."""
    return count * FETCH
