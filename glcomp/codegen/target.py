"""Targets are data: a GLSL ES dialect plus the limits the code generator must respect."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from glcomp.errors import GlcompError


@dataclass(frozen=True)
class Target:
    """A WebGL-class GPU profile.

    The defaults are portable minimums: every WebGL 2 device offers 4096-texel textures, 4 draw
    buffers and 16 fragment texture units. Tests shrink them to reach the code paths big models
    hit (split textures, split loops) on small ones.
    """

    name: str
    glsl_version: str  # "300 es" (WebGL 2) or "100" (WebGL 1)
    max_texture_size: int = 4096
    max_draw_buffers: int = 4
    max_texture_units: int = 16
    max_loop_iterations: int = 1024  # longer loops are split into nested constant-bound loops
    float_blend: bool = True  # EXT_float_blend: additive blending into float render targets
    # The cost model's constants for this device class, in element-iterations
    # (glcomp.codegen.cost; benchmarks/calibrate.py measures them): a draw call's fixed cost and
    # a register-blocked draw's. None: the cost model's defaults, measured on CPU rasterizers
    # (llvmpipe, SwiftShader), the conservative choice for a bundle meant to run anywhere.
    draw_cost: int | None = None
    blocked_draw_cost: int | None = None
    # How many fragments one draw needs to keep the device busy: a draw of fewer runs no faster
    # than one of this many (glcomp.codegen.cost.occupancy), so a product with few output blocks
    # and a long K is split over K towards it. None: the CPU rasterizers' rule, which splits only
    # products of at most a few hundred output texels (glcomp.codegen.passes.tiling).
    parallel_fragments: int | None = None

    @property
    def webgl1(self) -> bool:
        return self.glsl_version == "100"

    def to_json(self) -> dict[str, Any]:
        """The device limits, as the manifest records them (the cost constants only steer
        planning: a runtime has nothing to check them against)."""
        out = asdict(self)
        for key in COST_FIELDS:
            del out[key]
        return out


COST_FIELDS = ("draw_cost", "blocked_draw_cost", "parallel_fragments")


_BASE = {
    # WebGL 2: RGBA32F render targets through EXT_color_buffer_float, MRT in core.
    "webgl2": Target("webgl2", "300 es"),
    # WebGL 1: OES_texture_float + WEBGL_color_buffer_float; MRT through WEBGL_draw_buffers.
    "webgl1": Target("webgl1", "100", max_draw_buffers=4, float_blend=False),
    # Presets for the weakest devices a bundle should still run on, from the specifications'
    # portable minimums rather than from any one GPU:
    # - WebGL 1 on phones (OpenGL ES 2.0): ES 2.0 guarantees 8 fragment texture units
    #   (MAX_TEXTURE_IMAGE_UNITS); WEBGL_draw_buffers is an optional extension that most mobile
    #   WebGL 1 implementations lack, so one draw buffer; EXT_float_blend is rare there, so no
    #   float blending. ES 2.0's MAX_TEXTURE_SIZE minimum (64) is far below what any phone that
    #   renders float textures reports; 2048 is the conservative floor of those devices.
    "webgl1-mobile": Target(
        "webgl1-mobile",
        "100",
        max_texture_size=2048,
        max_draw_buffers=1,
        max_texture_units=8,
        float_blend=False,
    ),
    # - WebGL 2 on phones (OpenGL ES 3.0): ES 3.0 guarantees 16 fragment texture units and 4 draw
    #   buffers / color attachments; its MAX_TEXTURE_SIZE minimum is 2048, but phones that render
    #   to RGBA32F (EXT_color_buffer_float, which glcomp needs) report 4096 or more;
    #   EXT_float_blend is optional and often missing on mobile GPUs, so no float blending.
    "webgl2-mobile": Target(
        "webgl2-mobile",
        "300 es",
        max_texture_size=4096,
        max_draw_buffers=4,
        max_texture_units=16,
        float_blend=False,
    ),
    # Desktop-class GPUs through WebGL 2 (discrete or integrated; ANGLE on D3D11, Metal, Vulkan or
    # OpenGL): 8 draw buffers and 8192-texel textures, which such GPUs offer, and the cost model's
    # constants calibrated on one (benchmarks/calibrate.py on an NVIDIA H200 through EGL: a draw
    # costs about 1,030,000 element-iterations, and a register-blocked draw no more than any
    # other), so merging draws and blocking products pay at the sizes where they do on a GPU; and
    # the fragments a draw needs to fill it: on the H200 a product drawn over 4,096 fragments
    # looping 1,024 times ran 13x slower per multiply-add than one over 262,144 fragments looping
    # 64 times (per-draw profile of char-GPT medium); swept over whole train steps on the same GPU
    # (benchmarks/RESULTS.md), 2^14 gave the fastest char-GPT steps once batched products were
    # tiled (2^15, 2^16 and above slower; the CNNs the same within 1%).
    "webgl2-gpu": Target(
        "webgl2-gpu",
        "300 es",
        max_texture_size=8192,
        max_draw_buffers=8,
        max_texture_units=16,
        draw_cost=1_000_000,
        blocked_draw_cost=1_000_000,
        parallel_fragments=1 << 14,
    ),
}

TARGETS: tuple[str, ...] = tuple(_BASE)
"""The target names ``glcomp.compile(..., target=)`` accepts."""


def make_target(name: str, **limits: Any) -> Target:
    """The named target with some limits overridden (e.g. ``max_texture_size=16`` in tests)."""
    if name not in _BASE:
        raise GlcompError(f"unknown target {name!r}; use one of {sorted(_BASE)}")
    fields = set(Target.__dataclass_fields__) - {"name", "glsl_version"}
    unknown = set(limits) - fields
    if unknown:
        raise GlcompError(f"unknown target limits {sorted(unknown)}; known: {sorted(fields)}")
    target = replace(_BASE[name], **limits)
    size = target.max_texture_size
    if size < 1 or size & (size - 1):
        raise GlcompError(f"max_texture_size must be a power of two, got {size}")
    if target.max_texture_units < 2 or target.max_draw_buffers < 1 or target.max_loop_iterations < 2:
        raise GlcompError(f"target limits too small: {target}")
    return target
