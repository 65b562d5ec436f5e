"""fusion: inputs, outputs and loop results are stored; everything else is fused into the
kernels that read it (off: one kernel per op)."""

from __future__ import annotations

from glcomp import nn


def test_fusion_golden(plan_of, around, golden) -> None:
    _, after = around(plan_of(nn.Linear(4, 3), {"x": (2, 4)}), "fusion")
    golden(
        after,
        """
        plan predict after fusion: 8 nodes, 5 stored, 2 kernels
        k0_matmul matmul 2x1 writes %4(loop) reads %0:x %1:weight fuses 1 loops 16
        k1_add map 2x1 writes %7(output) reads %2:bias %4 fuses 2 loops 0
        """,
    )


def test_fusion_off_stores_every_op(plan_of, around, golden) -> None:
    _, after = around(plan_of(nn.Linear(4, 3), {"x": (2, 4)}, passes={"fusion": False}), "fusion")
    golden(
        after,
        """
        plan predict after fusion: 8 nodes, 8 stored, 5 kernels
        k0_permute map 2x2 writes %3(unfused) reads %1:weight fuses 0 loops 0
        k1_matmul matmul 2x1 writes %4(unfused) reads %0:x %3 fuses 0 loops 16
        k2_reshape map 1x1 writes %5(unfused) reads %2:bias fuses 0 loops 0
        k3_expand map 2x1 writes %6(unfused) reads %5 fuses 0 loops 0
        k4_add map 2x1 writes %7(unfused) reads %4 %6 fuses 0 loops 0
        """,
    )
