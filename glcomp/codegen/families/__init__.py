"""Kernel families: how the GL code generator renders each op, one module per family beside its
templates (map and movement ops fused into their readers, matmul with its blocked form, conv,
pool, reduce). Only this package names ops; `Lowering` records are registered per op."""

from glcomp.codegen.families import conv, image, matmul, movement, pool, reduce, resample  # noqa: F401
from glcomp.codegen.families.base import (
    FUSED_KINDS,
    LOOP_KINDS,
    LOWERINGS,
    Lowering,
    RenderContext,
    Rendered,
    environment,
    is_fused,
    loop_extent,
    lowering,
    safe_comment,
    template_of,
)
from glcomp.codegen.families.reduce import WIDE_OPS

__all__ = [
    "FUSED_KINDS",
    "LOOP_KINDS",
    "LOWERINGS",
    "WIDE_OPS",
    "Lowering",
    "RenderContext",
    "Rendered",
    "environment",
    "is_fused",
    "loop_extent",
    "lowering",
    "safe_comment",
    "template_of",
]
