"""memplan: a texture slot for every page of every temporary, reused by liveness.

Textures are grouped by size (width x height); a value takes a free texture of its size when its
kernel runs and gives it back after its last reader. Entry points run one at a time, so they
share one pool: the bundle allocates, per size, the most any entry point needs at once (`Pool`
names the slots).

Guarantees (those of `assign_slots`): a texture is never written by a draw that reads it, two
values alive at the same time never share a texture, and the values read back stay alive to the
end. Off with ``passes={"memplan": False}``: every temporary still gets slots, none shared.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from glcomp.codegen.kernel_plan import KernelPlan, Slot


@dataclass
class Pool:
    """Textures of each size; `names[(w, h)]` grows as entry points need more at once."""

    names: dict[tuple[int, int], list[str]] = field(default_factory=lambda: defaultdict(list))
    count: int = 0

    def texture(self, size: tuple[int, int], index: int) -> str:
        group = self.names[size]
        while len(group) <= index:
            group.append(f"tex{self.count}")
            self.count += 1
        return group[index]

    def sizes(self) -> dict[str, tuple[int, int]]:
        return {name: size for size, group in self.names.items() for name in group}


def memplan(plan: KernelPlan) -> KernelPlan:
    """A texture slot per page of every temporary, reused by liveness (off: none shared)."""
    steps = plan.steps()
    pinned = set(plan.readback().values())
    slots = assign_slots(steps, plan.temporaries(), pinned, plan.switches["memplan"])
    return plan.replace(memory={n: tuple(s) for n, s in slots.items()})


def assign_slots(
    steps: list[tuple[list[int], list[int]]],
    sizes: dict[int, list[tuple[int, int]]],
    pinned: set[int],
    reuse: bool = True,
) -> dict[int, list[Slot]]:
    """Assign texture slots (one per page; a slot is a size and an index among the textures of
    that size) to temporaries.

    `steps` lists, in execution order, each kernel's (values written, values read); values read
    before any step writes them are the entry's uploaded inputs. `pinned` values live to the end
    (read back by the caller). Guarantees: a texture is never written by a step that reads it,
    and two values alive at the same time never share a texture. With `reuse` off every value
    gets textures of its own (to measure what the plan saves).
    """
    last_use: dict[int, int] = {}
    for i, (writes, reads) in enumerate(steps):
        for v in reads + writes:
            last_use[v] = i
    for v in pinned:
        last_use[v] = len(steps)
    free: dict[tuple[int, int], list[int]] = defaultdict(list)
    used: dict[tuple[int, int], int] = defaultdict(int)
    slots: dict[int, list[Slot]] = {}

    def take(size: tuple[int, int]) -> Slot:
        if reuse and free[size]:
            return size, free[size].pop(0)
        used[size] += 1
        return size, used[size] - 1

    first_reads = [v for _, reads in steps for v in reads if v in sizes]
    written = {v for writes, _ in steps for v in writes}
    for v in dict.fromkeys(first_reads):  # uploaded inputs, allocated up front
        if v not in slots and v not in written:
            slots[v] = [take(s) for s in sizes[v]]
    for i, (writes, reads) in enumerate(steps):
        for v in writes:
            if v in sizes and v not in slots:
                slots[v] = [take(s) for s in sizes[v]]
        for v in set(reads + writes):
            if v in slots and last_use.get(v) == i:
                for size, index in slots[v]:
                    free[size].append(index)
                    free[size].sort()
    for v in sizes:  # values no kernel touches (an input returned as is): textures of their own
        if v not in slots:
            slots[v] = [take(s) for s in sizes[v]]
    return slots
