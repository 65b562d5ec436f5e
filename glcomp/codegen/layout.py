"""Texture packing for the code generator: the rule and `Layout` live in glcomp.format.packing
(the bundle format's one statement of it, which the runtimes follow too); this module keeps
their names where the planner and the kernel families import them."""

from glcomp.format.packing import Layout, layout_for

__all__ = ["Layout", "layout_for"]
