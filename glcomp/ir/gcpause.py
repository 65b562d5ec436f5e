"""Compiling without the cyclic garbage collector.

Tracing and lowering allocate many small objects that stay alive until the end (graph nodes,
attribute dicts, kernel plans): each collection the allocations trigger scans all of them again,
so with the collector running compile time grows faster than the graph. Nothing the compiler
builds needs the collector to be freed (reference counting frees it), so `gc_paused` pauses it
for the duration of a compile and restores it afterwards.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Run the block with automatic garbage collection off; it is on again afterwards exactly
    when it was on before (so nested blocks and callers that turned it off keep their state)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
