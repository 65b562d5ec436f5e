"""Program sharing: kernels that differ only in the node ids they were rendered from (every time
step of a recurrence, repeated layers) get one GLSL source, so the bundle lists one program and
the runtime compiles it once.

Rendered shaders name their functions and samplers after IR node ids (``v123``,
``glc_fetch_123``, ``s123_0``) and open with a comment listing the kernel's nodes. `canonical`
renumbers those identifiers by first appearance and drops the node list; draws keep their
kernel name, and the shader keeps its origin comments.
"""

from __future__ import annotations

import re

_NODE_LIST = re.compile(r"^// [^\n]*: nodes %[^\n]*\n", re.MULTILINE)
_NODE_NAME = re.compile(r"\b(v|glc_fetch_|s)(\d+)(_\d+)?\b")


def canonical(source: str) -> tuple[str, dict[str, str]]:
    """The source with node-id identifiers renumbered 0, 1, ... in order of first appearance
    (one number per node, whatever the prefix) and without the node-list comment, and the
    renaming applied (old sampler name -> new).

    Guarantee: a bijective renaming of identifiers the renderer generates from node ids, so the
    shader computes the same values; two kernels whose sources differ only in those ids get the
    same text."""
    source = _NODE_LIST.sub("", source, count=1)
    local: dict[str, int] = {}
    renamed: dict[str, str] = {}

    def rename(m: re.Match[str]) -> str:
        prefix, node, page = m.group(1), m.group(2), m.group(3)
        if prefix == "s" and page is None:
            return m.group(0)  # s<digits> without a page is not a sampler the renderer names
        if prefix != "s" and page is not None:
            return m.group(0)
        index = local.setdefault(node, len(local))
        new = f"{prefix}{index}{page or ''}"
        renamed[m.group(0)] = new
        return new

    return _NODE_NAME.sub(rename, source), renamed
