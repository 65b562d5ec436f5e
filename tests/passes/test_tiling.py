"""tiling: a matmul fused into its epilogue is split off and runs register-blocked, where the
cost model says that pays (forced here: no draw or gather cost, one block shape)."""

from __future__ import annotations

from typing import Any

import pytest

from glcomp import nn
from glcomp.codegen import cost
from glcomp.codegen.passes import tiling


class LinearRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x: Any) -> Any:
        return self.l(x).relu()


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiling, "SHAPES", ((2, 1),))
    monkeypatch.setattr(cost, "GATHER_FETCHES", 0)
    monkeypatch.setattr(cost, "BLOCKED_DRAW", 0)


def test_tiling_golden(forced, plan_of, around, golden) -> None:
    before, after = around(plan_of(LinearRelu(), {"x": (4, 8)}), "tiling")
    golden(
        before,
        """
        plan predict after blend: 9 nodes, 4 stored, 1 kernels
        k0_relu map 4x2 writes %8(output) reads %0:x %1:l.weight %2:l.bias fuses 5 loops 32
        """,
    )
    golden(
        after,
        """
        plan predict after tiling: 9 nodes, 5 stored, 2 kernels
        k0_relu_mm matmul 4x2 writes %4(loop) reads %0:x %1:l.weight fuses 1 loops 32 tiled 2x1 reader gathers
        k0_relu map 4x2 writes %8(output) reads %2:l.bias %4 fuses 3 loops 0
        """,
    )


@pytest.mark.parametrize(
    "options", [{"passes": {"tiling": False}}, {"storage": "rgba8"}, {"target": "webgl1"}]
)
def test_tiling_off_rgba8_and_webgl1_hand_the_plan_on(forced, plan_of, around, options) -> None:
    before, after = around(plan_of(LinearRelu(), {"x": (4, 8)}, **options), "tiling")
    assert after.kernels == before.kernels and not after.tilings


def test_tiling_pays_only_for_large_products(plan_of, around) -> None:
    before, after = around(plan_of(LinearRelu(), {"x": (4, 8)}), "tiling")
    assert after.kernels == before.kernels and not after.tilings


class FlattenLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(32, 3)

    def forward(self, x: Any) -> Any:
        return self.l(x.reshape(x.shape[0], -1))


def test_split_k_golden(monkeypatch: pytest.MonkeyPatch, plan_of, around, golden) -> None:
    """A long product with few outputs splits over K (threshold lowered to 4 steps): 1x1 blocks
    in 2 chunks, reading the flattened input in place (no reshape kernel)."""
    monkeypatch.setattr(tiling, "LONG_STEPS", 4)
    before, after = around(plan_of(FlattenLinear(), {"x": (2, 4, 8)}), "tiling")
    golden(
        after,
        """
        plan predict after tiling: 9 nodes, 5 stored, 2 kernels
        k0_add_mm matmul 2x1 writes %5(loop) reads %0:x %1:l.weight fuses 2 loops 128 tiled 1x1/2
        k0_add map 2x1 writes %8(output) reads %2:l.bias %5 fuses 2 loops 0
        """,
    )
    assert not before.tilings
