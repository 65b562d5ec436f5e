"""texture_units: fused operands are stored until no kernel samples more texture pages than the
target has texture units."""

from __future__ import annotations

from glcomp import nn


def test_texture_units_golden(plan_of, around, golden) -> None:
    """With 3 texture units the second layer's kernel (4 pages) stores a fused operand."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    before, after = around(plan_of(model, {"x": (2, 4)}, max_texture_units=3), "texture_units")
    assert "k1_add map 2x1 writes %15(output) reads %2:0.bias %3:2.weight %4:2.bias %6" in str(before)
    golden(
        after,
        """
        plan predict after texture_units: 16 nodes, 8 stored, 3 kernels
        k0_matmul matmul 2x2 writes %6(loop) reads %0:x %1:0.weight fuses 1 loops 16
        k1_matmul matmul 2x1 writes %12(texture-units) reads %2:0.bias %3:2.weight %6 fuses 5 loops 32
        k2_add map 2x1 writes %15(output) reads %4:2.bias %12 fuses 2 loops 0
        """,
    )


def test_texture_units_hands_on_a_plan_that_fits(plan_of, around) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    before, after = around(plan_of(model, {"x": (2, 4)}), "texture_units")
    assert after.kernels == before.kernels and after.stored == before.stored
