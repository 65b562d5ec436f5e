"""Hypothesis hooks that draw valid inputs for each op (used by glcomp.testing and tests).

Kept apart from the rules so the registry imports without Hypothesis installed.
"""

from __future__ import annotations

from typing import Any


def st() -> Any:
    import hypothesis.strategies as strategies

    return strategies


def dims(draw: Any, min_rank: int = 1, max_rank: int = 3, max_side: int = 6) -> tuple[int, ...]:
    rank = draw(st().integers(min_rank, max_rank))
    return tuple(draw(st().integers(1, max_side)) for _ in range(rank))


def same_shapes(n: int) -> Any:
    def sample(draw: Any) -> tuple[list[tuple[int, ...]], dict[str, Any]]:
        shape = dims(draw, 0, 4, 6)
        return [shape] * n, {}

    return sample
