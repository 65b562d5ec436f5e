"""blend: the terms of a sum of loop results render into the sum's texture, all but the first
with additive blending; the summing kernel disappears."""

from __future__ import annotations

import dataclasses
from typing import Any

from glcomp import nn
from glcomp.codegen.pipeline import PASS_NAMES, PIPELINE
from glcomp.codegen.target import make_target


class Twice(nn.Module):
    """One weight used twice: its gradient is a sum of two matmuls (blending's case)."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4, bias=False)

    def forward(self, x: Any) -> Any:
        return self.l(x) + self.l(x * 2.0)


PASSES = {"pushdown": True, "mrt": False, "epilogue": False, "join_sums": False}  # the sum stays a sum


def test_blend_golden(plan_of, around, golden) -> None:
    plan = plan_of(Twice(), {"x": (2, 4)}, entry="gradients", loss=nn.MSELoss(), passes=PASSES)
    before, after = around(plan, "blend")
    assert "->" not in str(before) and "k10_add" in str(before)
    golden(
        after,
        """
        plan gradients after blend: 30 nodes, 14 stored, 10 kernels
        k0_matmul matmul 2x1 writes %3(loop) reads %0:x %1:l.weight fuses 1 loops 16
        k1_mul map 2x1 writes %7(multi-reader) reads %0:x fuses 3 loops 0
        k2_matmul matmul 2x1 writes %9(loop) reads %1:l.weight %7 fuses 1 loops 16
        k3_sub map 2x1 writes %12(multi-reader) reads %3 %9 %11:y fuses 1 loops 0
        k4_sum reduce 1x1 writes %14(loop) reads %12 fuses 1 loops 32
        k5_mul map 1x1 writes %17(output) reads %14 fuses 2 loops 0
        k6_mul map 1x1 writes %19(multi-reader) reads - fuses 2 loops 0
        k7_add map 2x1 writes %25(multi-reader) reads %12 %19 fuses 4 loops 0
        k8_matmul matmul 2x2 writes %40(loop)->%37 reads %7 %25 fuses 1 loops 8
        k9_matmul matmul 2x2 writes %43(loop)->%37 reads %0:x %25 fuses 1 loops 8 blend
        """,
    )


def test_blend_needs_a_target_that_blends_floats(plan_of, around) -> None:
    plan = plan_of(Twice(), {"x": (2, 4)}, entry="gradients", loss=nn.MSELoss(), passes=PASSES)
    before, _ = around(plan, "blend")
    no_blend = dataclasses.replace(before, target=make_target("webgl2", float_blend=False))
    assert PIPELINE[PASS_NAMES.index("blend")].run(no_blend) is no_blend
