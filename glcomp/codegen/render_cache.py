"""Rendered kernels remembered across the entry points of one bundle.

`predict`, `gradients` and `train_step` are planned from graphs that share most of their node
ids (the backward graph extends the forward one, the update extends the backward one), so many
of their kernels are the same kernel: the same roots, fused body and leaves, computing the same
ops over the same shapes into the same layouts. Such a kernel is rendered once per bundle.

A kernel's key holds everything its rendering reads: its name, roots, body (in the order the
renderer defines them), leaves, template and origins, and for every node among them the op,
shape, dtype, attributes, origin, operands and texture layout, and which leaves are
hyper-parameter uniforms. Two kernels with equal keys render to the same `Rendered`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.codegen.plan import Kernel
from glcomp.codegen.render import KernelRenderer, Rendered


def _node_key(plan: KernelPlan, n: int) -> Hashable:
    data = plan.graph.node(n)
    attrs = tuple(sorted(data["attrs"].items()))
    return (n, data["op"], data["shape"], data["dtype"], attrs, data["origin"], tuple(plan.graph.operands(n)))


def kernel_key(
    plan: KernelPlan, kernel: Kernel, hypers: Mapping[int, str], position: Mapping[int, int]
) -> Hashable:
    """What rendering `kernel` of `plan` depends on (see the module docstring)."""
    nodes = sorted({*kernel.roots, *kernel.body, *kernel.leaves}, key=position.__getitem__)
    return (
        kernel.name,
        tuple(kernel.roots),
        tuple(kernel.body),
        tuple(kernel.leaves),
        kernel.template,
        tuple(kernel.origins),
        tuple(nodes),
        tuple(_node_key(plan, n) for n in nodes),
        tuple(plan.layouts.get(n) for n in nodes),
        tuple(hypers.get(n) for n in kernel.leaves),
    )


class RenderCache:
    """Renders kernels through a `KernelRenderer`, once per distinct `kernel_key` (one cache per
    bundle: the target is the same for every entry point)."""

    def __init__(self) -> None:
        self.rendered: dict[Hashable, Rendered] = {}
        self._plan: KernelPlan | None = None
        self._position: dict[int, int] = {}

    def render(
        self, renderer: KernelRenderer, plan: KernelPlan, kernel: Kernel, hypers: dict[int, str]
    ) -> Rendered:
        """`renderer.render(kernel, hypers)`, or the result of an equal kernel rendered before."""
        if self._plan is not plan:
            self._plan, self._position = plan, {n: i for i, n in enumerate(plan.order)}
        key = kernel_key(plan, kernel, hypers, self._position)
        if key not in self.rendered:
            self.rendered[key] = renderer.render(kernel, hypers)
        return self.rendered[key]
