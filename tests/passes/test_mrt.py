"""mrt: consecutive kernels that share inputs are merged into one multi-target draw."""

from __future__ import annotations

from glcomp import nn


def test_mrt_golden(plan_of, around, golden) -> None:
    plan = plan_of(nn.Linear(4, 3), {"x": (2, 4)}, entry="gradients", loss=nn.MSELoss())
    before, after = around(plan, "mrt")
    assert [line.strip() for line in str(before).splitlines()[3:5]] == [
        "k2_mul map 1x1 writes %16(multi-reader) reads - fuses 2 loops 0",
        "k3_add map 2x1 writes %22(multi-reader) reads %9 %16 fuses 4 loops 0",
    ]
    golden(
        after,
        """
        plan gradients after mrt: 27 nodes, 10 stored, 5 kernels
        k0_sub map 2x1 writes %9(multi-reader) reads %0:x %1:weight %2:bias %8:y fuses 5 loops 16
        k1_mul map 1x1 writes %14(output) reads %9 fuses 4 loops 24
        k2_mul+k3 map 2x1 writes %16(multi-reader) %22(multi-reader) reads %9 fuses 7 loops 0
        k4_reshape map 1x1 writes %25(output) reads %22 fuses 1 loops 8
        k5_permute map 2x2 writes %30(output) reads %0:x %22 fuses 2 loops 8
        """,
    )
    assert after.layouts[16] != before.layouts[16]  # resized to the group's footprint


def test_mrt_off_hands_the_plan_on(plan_of, around) -> None:
    plan = plan_of(
        nn.Linear(4, 3), {"x": (2, 4)}, entry="gradients", loss=nn.MSELoss(), passes={"mrt": False}
    )
    before, after = around(plan, "mrt")
    assert after.kernels == before.kernels and after.layouts == before.layouts
