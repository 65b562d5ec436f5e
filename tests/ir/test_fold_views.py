"""The fold_views pass: exact values, and no view chains or identity views left."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from glcomp.ir.graph import Graph
from glcomp.ir.interpret import evaluate
from glcomp.ir.passes import fold_views


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_chains_of_views_fold_exactly(data: st.DataObject) -> None:
    shape = (2, 3, 4)
    g = Graph()
    x = g.add_input("x", shape, "data")
    n = g.add("exp", [x])
    for _ in range(data.draw(st.integers(1, 5))):
        cur = g.shape(n)
        if data.draw(st.booleans()):
            perm = tuple(data.draw(st.permutations(range(len(cur)))))
            n = g.add("permute", [n], perm=perm)
        else:
            new = data.draw(st.sampled_from([(24,), (6, 4), (2, 12), (2, 3, 4), (4, 3, 2), cur]))
            n = g.add("reshape", [n], shape=new)
    g.outputs["out"] = g.add("mul", [n, n])
    out = fold_views(g)
    out.validate()
    feed = {"x": np.random.default_rng(0).normal(size=shape)}
    np.testing.assert_array_equal(evaluate(out, feed)["out"], evaluate(g, feed)["out"])
    for m in out.nodes():
        if out.op(m) in ("permute", "reshape"):
            (src,) = out.operands(m)
            assert out.op(src) != out.op(m), str(out)
            ident = out.attrs(m).get("perm") == tuple(range(len(out.shape(m)))) or (
                out.op(m) == "reshape" and out.shape(m) == out.shape(src)
            )
            assert not ident, str(out)


def test_gradient_of_linear_reads_the_weight_itself() -> None:
    g = Graph()
    w = g.add_input("w", (3, 5), "param")
    gy = g.add_input("g", (4, 3), "data")
    wt = g.add("permute", [w], perm=(1, 0))
    g.outputs["dx"] = g.add("matmul", [gy, g.add("permute", [wt], perm=(1, 0))])
    out = fold_views(g)
    _, b = out.operands(out.outputs["dx"])
    assert b == w  # (W.T).T is W: the matmul reads the stored weight directly


def _attention_key_grad(extra_reader: bool = False, transposed: bool = True) -> tuple[Graph, int]:
    """permute(bmm(permute(q), g)): autodiff's gradient of q @ k.T with respect to k."""
    g = Graph()
    q = g.add_input("q", (2, 5, 3), "data")
    gy = g.add_input("g", (2, 5, 5), "data")
    a = g.add("permute", [q], perm=(0, 2, 1)) if transposed else g.add_input("a", (2, 3, 5), "data")
    prod = g.add("bmm", [a, gy])
    g.outputs["dk"] = g.add("permute", [prod], perm=(0, 2, 1))
    if extra_reader:
        g.outputs["p"] = g.add("exp", [prod])
    return g, q


def test_transpose_of_a_product_moves_onto_its_operands() -> None:
    g, q = _attention_key_grad()
    out = fold_views(g)
    out.validate()
    dk = out.outputs["dk"]
    assert out.op(dk) == "bmm"
    a, b = out.operands(dk)
    assert b == q  # (q.T).T is q: the product reads the stored rows
    assert out.op(a) == "permute" and out.attrs(a)["perm"] == (0, 2, 1)
    rng = np.random.default_rng(1)
    feed = {"q": rng.normal(size=(2, 5, 3)), "g": rng.normal(size=(2, 5, 5))}
    np.testing.assert_allclose(evaluate(out, feed)["dk"], evaluate(g, feed)["dk"], rtol=1e-12)


def test_a_2d_product_transposed_stays() -> None:
    """A Linear's weight gradient (x.T @ g).T: its update reads the product transposed."""
    g = Graph()
    x = g.add_input("x", (6, 4), "data")
    gy = g.add_input("g", (6, 3), "data")
    g.outputs["dw"] = g.add(
        "permute", [g.add("matmul", [g.add("permute", [x], perm=(1, 0)), gy])], perm=(1, 0)
    )
    out = fold_views(g)
    assert out is g


def test_a_product_read_elsewhere_or_without_a_transposed_operand_stays() -> None:
    for g, _ in (_attention_key_grad(extra_reader=True), _attention_key_grad(transposed=False)):
        out = fold_views(g)
        assert out.op(out.outputs["dk"]) == "permute"
        (src,) = out.operands(out.outputs["dk"])
        assert out.op(src) == "bmm"
