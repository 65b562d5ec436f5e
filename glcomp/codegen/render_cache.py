"""Kernels lowered once per bundle: rendered to GLSL and put in canonical form (programs.canonical)
once for every group of kernels that differ only in their node ids.

The kernels of an unrolled recurrence repeat with new node ids at every step (and those of
stacked layers or attention heads at every layer or head), and `predict`, `gradients` and
`train_step` are planned from graphs that share most of their nodes. Program sharing already
makes such kernels one program; this cache also renders them once.

A kernel's `shape_key` holds everything its rendering reads but its origins, with every node
named by its place in the kernel (leaves in order, then the fused nodes and elementwise roots in
the renderer's topological order, then the other roots) instead of its id: the template, which
places are roots and body, and for every node its op, shape, dtype, attributes (an input's
but its name, which only the runtime reads), operands (places; -1 outside the kernel), texture
layout and hyper-parameter name.
Two kernels with equal keys render to the same text up to a renaming of node ids and their
origin comments, so they have the same canonical source but for those comments, offsets and
uniforms, and samplers at the same places, except where the renderer writes a node id into a
name that canonical() does not renumber (such as the flat-index variable of a vec4 cache): a
kernel is taken from the cache only when its nodes at the places whose ids appear in the cached
source are the same nodes. Origins (the model parts a kernel came from) reach the shader only as
its ``// from <origin>`` comment lines, one block where the node list was: the cache keeps the
source without them and writes each kernel's own (the layers of a stack, the heads of an
attention layer render once). An origin whose comment canonical() could read as code (a
generated name in it, or a word followed by a parenthesis) keeps the origins in the key.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from glcomp.codegen.families import Rendered, is_fused, safe_comment
from glcomp.codegen.families.movement import zero_reaches_product
from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.codegen.kernels import Kernel
from glcomp.codegen.layout import Layout
from glcomp.codegen.programs import NODE_NAME, ORIGIN, canonical, key_digest, sharing_digest
from glcomp.codegen.render import KernelRenderer
from glcomp.ir.ops import get_op

# A run of digits inside an identifier: one that follows a letter or underscore (an identifier
# runs over letters, digits and underscores, and starts at a letter or underscore).
_NAME_DIGITS = re.compile(r"(?<=[A-Za-z_])[0-9]+")
_CALL_LIKE = re.compile(r"\w\(")  # a word followed by a parenthesis: a call to drop_unused_helpers


def _numbers_in_names(source: str) -> set[int]:
    """Every number written inside an identifier of the canonical `source` but those canonical()
    wrote: its renumbered names (every NODE_NAME but a sampler-like ``s<digits>`` without a page,
    which it keeps) hold indices of first appearance, not node ids."""
    kept = NODE_NAME.sub(lambda m: m[0] if m[1] == "s" and m[3] is None else " ", source)
    return {int(d) for d in set(_NAME_DIGITS.findall(kept))}


@dataclass(frozen=True)
class Lowered:
    """A kernel's shader in canonical form (programs.canonical) with what a draw of it binds:
    its samplers as (canonical uniform name, node, page), its hyper-parameter uniforms as
    (uniform name, hyper-parameter name) and the values of its offset uniforms."""

    source: str
    samplers: list[tuple[str, int, int]]
    uniforms: list[tuple[str, str]]
    offsets: dict[str, int]
    # programs.sharing_digest(source) where already known (kernels lowered from the cache)
    known_digest: str | None = field(default=None, compare=False)

    @classmethod
    def of(cls, rendered: Rendered) -> Lowered:
        """The canonical form of a rendered shader."""
        source, renamed, offsets = canonical(rendered.source)
        samplers = [(renamed.get(s, s), n, p) for s, n, p in rendered.samplers]
        return cls(source, samplers, list(rendered.uniforms), offsets | rendered.ints)

    @property
    def digest(self) -> str:
        """programs.sharing_digest of the source: equal for sources that make one program."""
        return self.known_digest if self.known_digest is not None else sharing_digest(self.source)


def kernel_places(plan: KernelPlan, kernel: Kernel, position: Mapping[int, int]) -> list[int]:
    """The kernel's nodes in the order of their places: leaves (in order), then the fused nodes
    and elementwise roots in topological order, then the other roots."""
    g = plan.graph
    inline = set(kernel.body) | {r for r in kernel.roots if is_fused(g, r)}
    return [
        *kernel.leaves,
        *sorted(inline, key=position.__getitem__),
        *(r for r in kernel.roots if r not in inline),
    ]


def _node_facts(plan: KernelPlan, n: int, hypers: Mapping[int, str]) -> tuple[Any, ...]:
    """What rendering reads of node `n` but its operands: op, shape, dtype, attributes (an
    input's but its name), texture layout, hyper-parameter name and, for a constant, whether
    it reads the zero uniform."""
    data = plan.graph.node(n)
    attrs = tuple(sorted(data["attrs"].items()))
    if get_op(data["op"]).feed:  # read as a texture or uniform: its name is the runtime's
        attrs = tuple(kv for kv in attrs if kv[0] != "name")
    tiled = None
    if n in plan.from_tiles:  # read from its tiles: their geometry is in the reader's fetches
        t = plan.tilings[plan.from_tiles[n]]
        tiled = tuple(sorted(t.read_params(plan.target.max_texture_size).items()))
    # a zero constant reads the zero uniform or is written as a literal by its graph's readers,
    # some of which may lie outside the kernel (movement.const_emit)
    zero = zero_reaches_product(plan.graph, n)
    return (data["op"], data["shape"], data["dtype"], attrs, plan.layouts.get(n), hypers.get(n), tiled, zero)


def shape_key(
    plan: KernelPlan,
    kernel: Kernel,
    hypers: Mapping[int, str],
    places: list[int],
    facts: dict[int, tuple[Any, ...]] | None = None,
) -> Hashable:
    """What rendering `kernel` depends on, nodes named by place (see the module docstring).
    `facts` remembers each node's `_node_facts` across the kernels of one plan and `hypers`."""
    local = {n: i for i, n in enumerate(places)}
    facts = {} if facts is None else facts
    nodes = []
    for n in places:
        fact = facts.get(n)
        if fact is None:
            fact = facts[n] = _node_facts(plan, n, hypers)
        nodes.append((fact, tuple(local.get(o, -1) for o in plan.operands[n])))
    comments = [safe_comment(o) for o in kernel.origins]
    spliced = not any(NODE_NAME.search(c) or _CALL_LIKE.search(c) for c in comments)
    return (
        kernel.template,
        bool(comments) if spliced else tuple(comments),
        len(kernel.leaves),
        tuple(local[r] for r in kernel.roots),
        tuple(local[b] for b in kernel.body),
        tuple(nodes),
    )


def _split_origins(source: str, origins: str) -> tuple[str, str] | None:
    """(head, tail): `source` is head + `origins` (its origin comment lines) + tail, and neither
    part holds another origin line; None where the source is not laid out so. Kernels without
    origins share entries only with each other (the keys say which): the head is then empty."""
    at = source.find(f"\n{ORIGIN}") + 1 if origins else 0
    if (origins and at <= 0) or source[at : at + len(origins)] != origins:
        return None
    head, tail = source[:at], source[at + len(origins) :]
    if f"\n{ORIGIN}" in tail or tail.startswith(ORIGIN) or head.startswith(ORIGIN):
        return None
    return head, tail


def _origin_lines(kernel: Kernel) -> tuple[str, Hashable]:
    """The kernel's origin comment lines, and what of them a cache key holds: whether there are
    any, or the comments themselves where canonical() could read one as code."""
    comments = [safe_comment(o) for o in kernel.origins]
    spliced = not any(NODE_NAME.search(c) or _CALL_LIKE.search(c) for c in comments)
    return "".join(f"{ORIGIN}{c}\n" for c in comments), bool(comments) if spliced else tuple(comments)


class RenderCache:
    """Lowers kernels through a `KernelRenderer`, rendering once per distinct `shape_key` (one
    cache per bundle: the target is the same for every entry point)."""

    def __init__(self) -> None:
        # shape key -> [(pinned, (head, tail), samplers as (name, place, page), uniforms, offsets,
        # digest)]: `pinned` holds (place, node) for every place whose node id the source may
        # name; the source is head + the kernel's origin comments + tail
        self.lowered: dict[Hashable, list[tuple[Any, ...]]] = {}
        self._plan: KernelPlan | None = None
        self._position: dict[int, int] = {}
        self._hypers: Mapping[int, str] = {}
        self._facts: dict[int, tuple[Any, ...]] = {}  # _node_facts of the plan's nodes
        # register-blocked kernels: tiled key -> per draw (head, tail, samplers as (name, role,
        # page), uniforms, offsets, digest); a role indexes the tiling's nodes, then its tiles
        self.tiled: dict[Hashable, list[tuple[Any, ...]]] = {}

    @staticmethod
    def _sampler(plan: KernelPlan, name: str, node: int, page: int) -> tuple[str, int, int]:
        """A cached sampler at `node`'s place: page `page` of it, or (page -1 - i) tile i of
        the product `node` read from its tiles."""
        if page >= 0:
            return (name, node, page)
        return (name, plan.tilings[plan.from_tiles[node]].tiles[-1 - page], 0)

    def lower(
        self, renderer: KernelRenderer, plan: KernelPlan, kernel: Kernel, hypers: dict[int, str]
    ) -> Lowered:
        """``Lowered.of(renderer.render(kernel, hypers))``, from an equal kernel lowered before
        where there is one."""
        if self._plan is not plan or self._hypers is not hypers:
            self._plan, self._position = plan, {n: i for i, n in enumerate(plan.order)}
            self._hypers, self._facts = hypers, {}
        places = kernel_places(plan, kernel, self._position)
        origins = "".join(f"{ORIGIN}{safe_comment(o)}\n" for o in kernel.origins)
        entries = self.lowered.setdefault(shape_key(plan, kernel, hypers, places, self._facts), [])
        for pinned, (head, tail), samplers, uniforms, offsets, digest in entries:
            if all(places[i] == n for i, n in pinned):
                return Lowered(
                    head + origins + tail,
                    [self._sampler(plan, s, places[i], p) for s, i, p in samplers],
                    list(uniforms),
                    dict(offsets),
                    digest,
                )
        lowered = Lowered.of(renderer.render(kernel, hypers))
        split = _split_origins(lowered.source, origins)
        if split is None:
            return lowered  # not the layout this cache knows: rendered every time, never wrong
        head, tail = split
        named = _numbers_in_names(head + tail)
        pinned = tuple((i, n) for i, n in enumerate(places) if n in named)
        place = {n: i for i, n in enumerate(places)}
        tile_at: dict[int, tuple[int, int]] = {}  # a tile read in place of a product is cached
        for leaf in kernel.leaves:  # as page -1 - i at the product's place
            if leaf in plan.from_tiles:
                for i, tile in enumerate(plan.tilings[plan.from_tiles[leaf]].tiles):
                    tile_at[tile] = (place[leaf], -1 - i)
        samplers = [(s, place[n], p) if n in place else (s, *tile_at[n]) for s, n, p in lowered.samplers]
        # the origin lines are the only ones sharing_key drops: it keeps head + tail
        digest = key_digest(head + tail)
        entries.append(
            (pinned, (head, tail), samplers, list(lowered.uniforms), dict(lowered.offsets), digest)
        )
        return Lowered(lowered.source, lowered.samplers, lowered.uniforms, lowered.offsets, digest)

    def lower_tiled(
        self, kernel: Kernel, tiling: Any, layouts: Mapping[int, Layout], target: Any
    ) -> list[Lowered]:
        """``[Lowered.of(r) for r in tiling.render(kernel, layouts, target)]`` (the block draw's and
        the gather draw's shaders of a register-blocked kernel), from an equal tiling of other
        nodes lowered before where there is one: the same class and fields but the node ids
        (`NODE_FIELDS`), the same pattern of equal ids (A @ A.T), the same layouts of those nodes
        and the same origin layout. Its shaders differ from the cached ones only in the node ids
        that canonical() renumbers and in their origin lines; a shader naming a node id anywhere
        else is never cached."""
        ids = [getattr(tiling, name) for name in tiling.NODE_FIELDS]
        origins, origin_key = _origin_lines(kernel)
        fields = tuple(
            (f.name, getattr(tiling, f.name))
            for f in dataclasses.fields(tiling)
            if f.name not in tiling.NODE_FIELDS
        )
        pattern = tuple(ids.index(n) for n in ids)
        key = (type(tiling).__name__, fields, pattern, tuple(layouts[n] for n in ids), origin_key)
        nodes = [*ids, *tiling.tiles]
        cached = self.tiled.get(key)
        if cached is not None:
            return [
                Lowered(
                    head + origins + tail,
                    [(s, nodes[role], page) for s, role, page in samplers],
                    list(uniforms),
                    dict(offsets),
                    digest,
                )
                for head, tail, samplers, uniforms, offsets, digest in cached
            ]
        lowered = [Lowered.of(r) for r in tiling.render(kernel, dict(layouts), target)]
        role = {n: i for i, n in reversed(list(enumerate(nodes)))}
        entries = []
        for low in lowered:
            split = _split_origins(low.source, origins)
            if split is None or _numbers_in_names(split[0] + split[1]) & set(ids):
                return lowered  # rendered every time, never wrong
            samplers = [(s, role[n], page) for s, n, page in low.samplers]
            entries.append(
                (*split, samplers, list(low.uniforms), dict(low.offsets), key_digest(split[0] + split[1]))
            )
        self.tiled[key] = entries
        return [
            Lowered(low.source, low.samplers, low.uniforms, low.offsets, entry[-1])
            for low, entry in zip(lowered, entries, strict=True)
        ]
