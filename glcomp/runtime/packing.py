"""Pack arrays into RGBA texel pages and back, following a layout record from a manifest: the
bundle format's rule, glcomp.format.packing (the runtimes read only the recorded numbers)."""

from glcomp.format.packing import pack, unpack

__all__ = ["pack", "unpack"]
