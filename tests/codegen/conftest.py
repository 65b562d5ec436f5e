"""Fixtures of the code-generation tests."""

from __future__ import annotations

from typing import Any

import pytest

from glcomp.codegen import cost
from glcomp.codegen.passes import tiling


@pytest.fixture
def force(monkeypatch: pytest.MonkeyPatch) -> Any:
    """force((R, C)): tile every eligible matmul with that block shape, whatever its size (the
    block and gather draws cost nothing). Modules that force otherwise define their own."""

    def apply(shape: tuple[int, int]) -> None:
        monkeypatch.setattr(tiling, "SHAPES", (shape,))
        monkeypatch.setattr(cost, "BLOCKED_DRAW", 0)
        monkeypatch.setattr(cost, "GATHER_FETCHES", 0)

    return apply
