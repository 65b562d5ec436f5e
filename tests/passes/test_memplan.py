"""memplan: a texture slot for every page of every temporary, reused by liveness."""

from __future__ import annotations

from glcomp import nn, optim


def test_memplan_golden(plan_of, around, golden) -> None:
    plan = plan_of(nn.Linear(4, 3), {"x": (2, 4)}, entry="gradients", loss=nn.MSELoss())
    _, after = around(plan, "memplan")
    golden(
        after,
        """
        plan gradients after memplan: 27 nodes, 10 stored, 5 kernels, 7 texture slots
        k0_sub map 2x1 writes %9(multi-reader)@2x1#2 reads %0:x %1:weight %2:bias %8:y fuses 5 loops 16
        k1_mul map 1x1 writes %14(output)@1x1#0 reads %9 fuses 4 loops 24
        k2_mul+k3 map 2x1 writes %16(multi-reader)@2x1#1 %22(multi-reader)@2x1#3 reads %9 fuses 7 loops 0
        k4_reshape map 1x1 writes %25(output)@1x1#1 reads %22 fuses 1 loops 8
        k5_permute map 2x2 writes %30(output)@2x2#0 reads %0:x %22 fuses 2 loops 8
        """,
    )


def test_memplan_off_shares_no_slot(plan_of, around) -> None:
    plan = plan_of(
        nn.Linear(4, 3), {"x": (2, 4)}, entry="gradients", loss=nn.MSELoss(), passes={"memplan": False}
    )
    _, after = around(plan, "memplan")
    slots = [s for v in after.memory.values() for s in v]
    assert len(slots) == len(set(slots)) == len(after.memory)  # nothing shared


def test_state_targets_print_their_state(plan_of, around) -> None:
    plan = plan_of(
        nn.Linear(4, 3), {"x": (2, 4)}, entry="train_step", loss=nn.MSELoss(), optimizer=optim.SGD(lr=0.1)
    )
    text = str(around(plan, "memplan")[1])
    assert "(state)@state:weight" in text and "(state)@state:bias" in text and "%31:lr" in text
