"""Typed compile options: what ``glcomp.compile(**options)`` may say about code generation.

`CompileOptions` is the single source of the option names, their types and their defaults:
`glcomp.compile` checks its keyword arguments with `CompileOptions.parse` before tracing, and the
code generator reads the options of a Program (kept as plain JSON data in ``Program.options`` and
program.json) through the same function. Unknown or misspelt names and values of the wrong type
raise GlcompError naming the option and listing the valid ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from glcomp.codegen.target import TARGETS, Target, make_target
from glcomp.errors import GlcompError

# Texel formats of textures (``storage=``); see glcomp.codegen.bundle.texture_formats.
STORAGE = {
    "f32": "RGBA32F textures everywhere (the default)",
    "f16": "RGBA16F temporaries (activations, gradients): half their texture memory and bandwidth; "
    "states (parameters, buffers, optimizer moments), entry inputs and the loss stay RGBA32F",
    "rgba8": "every texture RGBA8, a float32's 4 bytes per texel (4x wider textures): exact float32 "
    "storage that needs no float texture extension (WebGL 1 baseline); shaders decode on read and "
    "encode on write, so reads cost 4 fetches and each output texel is computed 4 times; no blending",
}

# The code-generation passes ``passes={name: bool}`` may switch: each name is also the name of
# the pass in glcomp.codegen.pipeline.PIPELINE, of its module glcomp.codegen.passes.<name> and
# the function there, and its dump name.
PASSES = {
    "fusion": "fuse elementwise, movement and index ops into the kernels that read them",
    "epilogue": "run a loop kernel (matmul, conv, reduce, pool) inside the elementwise kernel "
    "that alone reads it",
    "mrt": "write results of consecutive kernels that share inputs from one draw call",
    "memplan": "reuse temporary textures by liveness",
    "pushdown": "push transposes below matmuls and sums (IR rewrite)",
    "blend": "accumulate sums of kernel results with additive blending (float-blend targets)",
    "fold_views": "fold transposes of transposes and reshapes of reshapes (IR rewrite, exact)",
    "join_sums": "join a sum of products into one product over concatenated operands (IR rewrite)",
    "split_reductions": "reduce long sums and maxima with few outputs in two parallel stages (IR rewrite)",
    "pointwise": "run 1x1 convolutions and their gradients as matrix products on GPU targets (IR rewrite)",
    "split_weight_grads": "split long convolution weight gradients into partial sums side by side "
    "in one draw (IR rewrite)",
    "tiling": "run large matmuls and convolutions as register-blocked multi-target draws plus a gather draw",
}

# Measured on the test LSTM: pushing transposes down costs more draws than MRT fusion saves
# there, so it is opt-in (it is what lets blending accumulate transposed weight gradients).
OFF_BY_DEFAULT = frozenset({"pushdown"})

# Target limits a compile option may override (every field of Target but its name and dialect).
LIMITS = tuple(f.name for f in dataclasses.fields(Target) if f.name not in ("name", "glsl_version"))


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _inspect_names(value: Any, storage: str) -> tuple[str, ...]:
    """The ``inspect=`` option checked: a list of tensor names (strings), duplicates dropped."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise GlcompError(
            f"inspect must be a list of tensor names such as ['0', 'grad:0.weight'], got {value!r}"
        )
    bad = [v for v in value if not isinstance(v, str) or not v or len(v) > 200]
    if bad:
        raise GlcompError(
            f"inspect: tensor names must be non-empty strings (at most 200 characters), got {bad!r}"
        )
    if value and storage == "f16":
        # A kept tensor is stored where it may have been fused in registers: with half-precision
        # temporaries its readers would see a rounded value and the training would change.
        raise GlcompError(
            "inspect= needs storage='f32' or 'rgba8' (exact float32 storage); got storage='f16'"
        )
    return tuple(dict.fromkeys(value))


@dataclass(frozen=True)
class CompileOptions:
    """The code-generation options of a compiled program, checked.

    Guarantees: `target` names a known target; each limit is None (the target's own) or a
    positive int (a bool for `float_blend`), `max_texture_size` a power of two; `passes` holds
    every switchable pass (those not given take their default: on, except OFF_BY_DEFAULT);
    `storage` is a key of STORAGE; `inspect` holds distinct non-empty tensor names.
    """

    target: str = "webgl2"
    max_texture_size: int | None = None
    max_draw_buffers: int | None = None
    max_texture_units: int | None = None
    max_loop_iterations: int | None = None
    float_blend: bool | None = None
    draw_cost: int | None = None
    blocked_draw_cost: int | None = None
    parallel_fragments: int | None = None
    passes: Mapping[str, bool] = field(
        default_factory=lambda: MappingProxyType({k: k not in OFF_BY_DEFAULT for k in PASSES})
    )
    storage: str = "f32"
    # Tensors kept readable by ``rt.inspect(name)`` (docs/inspect.md): each becomes an extra
    # output ``inspect:<name>`` of the entries that compute it.
    inspect: tuple[str, ...] = ()

    @classmethod
    def names(cls) -> list[str]:
        """Every option name `parse` accepts, sorted."""
        return sorted(f.name for f in dataclasses.fields(cls))

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> CompileOptions:
        """Check `options` (compile keyword arguments, or ``Program.options``) and type them.
        Raises GlcompError naming the first unknown option, pass or ill-typed value."""
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise GlcompError(f"unknown compile options {unknown}; known: {cls.names()}")
        target = options.get("target", "webgl2")
        if not isinstance(target, str) or target not in TARGETS:
            raise GlcompError(f"unknown target {target!r}; use one of {TARGETS}")
        limits: dict[str, Any] = {}
        for key in LIMITS:
            if key not in options:
                continue
            value = options[key]
            if key == "float_blend":
                if not isinstance(value, bool | np.bool_):
                    raise GlcompError(f"{key} must be True or False, got {value!r}")
                limits[key] = bool(value)
                continue
            if not _is_int(value) or value < 1:
                raise GlcompError(f"{key} must be a positive int, got {value!r}")
            if key == "max_texture_size" and value & (value - 1):
                raise GlcompError(f"max_texture_size must be a power of two, got {value}")
            limits[key] = int(value)
        storage = options.get("storage", "f32")
        if not isinstance(storage, str) or storage not in STORAGE:
            raise GlcompError(f"storage must be one of {list(STORAGE)}, got {storage!r}")
        given = options.get("passes")
        if given is None:
            given = {}
        if not isinstance(given, Mapping):
            raise GlcompError(
                f"passes must be a dict such as {{'fusion': False}}, got a {type(given).__name__}"
            )
        bad = sorted(set(given) - set(PASSES), key=str)
        if bad:
            raise GlcompError(f"unknown passes {bad}; known: {sorted(PASSES)}")
        for name, on in given.items():
            if not isinstance(on, bool | np.bool_):
                raise GlcompError(f"passes[{name!r}] must be True or False, got {on!r}")
        passes = {name: bool(given.get(name, name not in OFF_BY_DEFAULT)) for name in PASSES}
        inspect = _inspect_names(options.get("inspect", ()), storage)
        return cls(target=target, passes=MappingProxyType(passes), storage=storage, inspect=inspect, **limits)

    def make_target(self) -> Target:
        """The target these options describe: the named profile with the given limits."""
        limits = {k: getattr(self, k) for k in LIMITS if getattr(self, k) is not None}
        return make_target(self.target, **limits)

    def planning_target(self) -> Target:
        """The limits kernels and layouts are planned under: `make_target`'s, except that with
        ``storage="rgba8"`` a texture of logical width w is 4w GL texels wide, so layouts keep to
        a quarter of the device's texture size (the manifest still records the device's own)."""
        target = self.make_target()
        if self.storage == "rgba8":
            return replace(target, max_texture_size=max(1, target.max_texture_size // 4))
        return target
