"""epilogue: a loop kernel runs inside the elementwise kernel that alone reads it."""

from __future__ import annotations

from glcomp import nn


def test_epilogue_golden(plan_of, around, golden) -> None:
    _, after = around(plan_of(nn.Linear(4, 3), {"x": (2, 4)}), "epilogue")
    golden(
        after,
        """
        plan predict after epilogue: 8 nodes, 4 stored, 1 kernels
        k0_add map 2x1 writes %7(output) reads %0:x %1:weight %2:bias fuses 4 loops 16
        """,
    )


def test_epilogue_off_and_unfused_hand_the_plan_on(plan_of, around) -> None:
    for passes in ({"epilogue": False}, {"fusion": False}):
        before, after = around(plan_of(nn.Linear(4, 3), {"x": (2, 4)}, passes=passes), "epilogue")
        assert after.kernels == before.kernels and after.stored == before.stored
