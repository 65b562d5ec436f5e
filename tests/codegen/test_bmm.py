"""Batched products (`bmm`): `@` on 3-D and 4-D tensors is one kernel over the whole batch.

GL against the reference runtime for every way an operand reaches the product (stored, the
transpose of a stored tensor as in q @ k.transpose(-2, -1), fused expressions), both dialects and
the three storages, forward and gradients; and the draw count of attention-shaped models is the
same at every batch size (it grew with the batch when each batch element was a product of its
own).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import SumLoss
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import glcomp
from codegen.test_matmul_tiled import tiled_shapes
from glcomp import nn
from glcomp.codegen.bundle import build_bundle

RTOL, ATOL = 1e-4, 1e-5


class Batched(nn.Module):
    """a @ b over a batch; `form` picks how each operand reaches the product."""

    def __init__(self, m: int, k: int, n: int, form: str) -> None:
        super().__init__()
        rng = np.random.default_rng(m * 100 + k * 10 + n)
        self.form = form
        self.form_b = rng.normal(size=(k, n)).astype(np.float32)
        self.wq = nn.Parameter(rng.normal(size=(k, k)).astype(np.float32))
        self.wv = nn.Parameter(rng.normal(size=(k, n)).astype(np.float32))

    def forward(self, x: Any) -> Any:  # x: (B, M, K)
        if self.form == "attention":  # scores of q against k = x: B the transpose of a fused view
            q = x @ self.wq
            return (q @ x.transpose(-2, -1)) * 0.5
        if self.form == "values":  # B stored (a product's result), A fused (a softmax)
            v = x @ self.wv
            w = (x @ x.transpose(-2, -1)).softmax(-1)
            return w @ v
        if self.form == "stored":  # both operands stored values
            q, v = x @ self.wq, x @ self.wv
            return q.transpose(-2, -1) @ v  # A the transpose of a stored value
        raise ValueError(self.form)


def out_shape(form: str, b: int, m: int, k: int, n: int) -> tuple[int, ...]:
    return {"attention": (b, m, m), "values": (b, m, n), "stored": (b, k, n)}[form]


def check(prog: glcomp.Program, gl_runtime: Any, shape: tuple[int, ...], seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=prog.inputs["x"].shape).astype(np.float32)
    y = rng.normal(size=shape).astype(np.float32)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        want = ref.predict(x=x)
        scale = float(np.abs(want).max()) or 1.0
        np.testing.assert_allclose(gl.predict(x=x), want, rtol=RTOL, atol=ATOL * scale)
        got, want_g = gl.gradients(x=x, y=y), ref.gradients(x=x, y=y)
        for name in want_g:
            scale = float(np.abs(want_g[name]).max()) or 1.0
            np.testing.assert_allclose(got[name], want_g[name], rtol=RTOL, atol=ATOL * scale, err_msg=name)


@pytest.mark.parametrize("form", ["attention", "values", "stored"])
@pytest.mark.parametrize("target", ["webgl2", "webgl1"])
@pytest.mark.parametrize("k", [3, 4, 9])  # K % 4: a tail only, no tail, a tail after full steps
def test_bmm_matches_reference(form: str, target: str, k: int, gl_runtime: Any) -> None:
    b, m, n = 3, 5, 6
    prog = glcomp.compile(Batched(m, k, n, form), {"x": (b, m, k)}, loss=SumLoss(), target=target)
    check(prog, gl_runtime, out_shape(form, b, m, k, n))


@pytest.mark.parametrize("storage", ["f16", "rgba8"])
def test_bmm_in_every_storage(storage: str, gl_runtime: Any) -> None:
    prog = glcomp.compile(Batched(4, 6, 5, "values"), {"x": (2, 4, 6)}, loss=SumLoss(), storage=storage)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 4, 6)).astype(np.float32)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:  # each storage rounds like its reference (f16: half precision)
        np.testing.assert_allclose(gl.predict(x=x), ref.predict(x=x), rtol=2e-3, atol=2e-3)


@settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    b=st.integers(1, 4),
    m=st.integers(1, 7),
    k=st.integers(1, 10),
    n=st.integers(1, 9),
    form=st.sampled_from(["attention", "values", "stored"]),
    target=st.sampled_from(["webgl2", "webgl1"]),
    passes=st.fixed_dictionaries({p: st.booleans() for p in ("fusion", "epilogue", "mrt", "blend")}),
)
def test_bmm_random_shapes_and_passes(b, m, k, n, form, target, passes, gl_runtime: Any) -> None:
    model = Batched(m, k, n, form)
    prog = glcomp.compile(model, {"x": (b, m, k)}, loss=SumLoss(), target=target, passes=passes)
    check(prog, gl_runtime, out_shape(form, b, m, k, n))


class Attention(nn.Module):
    """One causal attention head over (B, T, C), as char-GPT's `Head`."""

    def __init__(self, t: int, c: int) -> None:
        super().__init__()
        self.key, self.query, self.value = (nn.Linear(c, c, bias=False) for _ in range(3))
        self.register_buffer("tril", glcomp.tril(glcomp.ones(t, t)))

    def forward(self, x: Any) -> Any:
        k, q, v = self.key(x), self.query(x), self.value(x)
        wei = (q @ k.transpose(-2, -1)) * k.shape[-1] ** -0.5
        wei = wei.masked_fill(self.tril == 0, float("-inf")).softmax(-1)
        return wei @ v


def draws(prog: glcomp.Program) -> dict[str, int]:
    return {e: len(v["draws"]) for e, v in build_bundle(prog).manifest["entries"].items()}


# The passes whose decisions follow sizes: splits of a reduction by its length (the weight
# gradients' products over K = B * T take more parts as the batch grows, each a fragment loop of
# bounded length) and MRT's grouping (by the cost model and the loop budget).
SIZE_DRIVEN = {"split_reductions": False, "split_weight_grads": False, "tiling": False, "mrt": False}


@pytest.mark.parametrize("passes", [{}, SIZE_DRIVEN], ids=["default", "no_size_driven_passes"])
def test_attention_draws_do_not_grow_with_the_batch(passes: dict[str, bool]) -> None:
    """predict is the same draws at every batch size; so is every entry point without the passes
    whose decisions follow sizes."""
    counts = {
        batch: draws(glcomp.compile(Attention(16, 8), {"x": (batch, 16, 8)}, loss=SumLoss(), passes=passes))
        for batch in (1, 4, 32)
    }
    assert counts[1]["predict"] == counts[4]["predict"] == counts[32]["predict"], counts
    if passes:
        assert counts[1] == counts[4] == counts[32], counts


def test_four_dimensional_matmul_is_one_product() -> None:
    """(2, 3, M, K) @ (2, 3, K, N): the batch axes flatten into one bmm node."""
    from glcomp.ir.tensor import Tensor  # noqa: F401  (the traced graph's node type)

    class Four(nn.Module):
        def forward(self, x: Any) -> Any:
            return x @ x.transpose(-2, -1)

    prog = glcomp.compile(Four(), {"x": (2, 3, 5, 4)})
    ops = [prog.graphs["predict"].op(n) for n in prog.graphs["predict"].topo()]
    assert ops.count("bmm") == 1 and "matmul" not in ops
    x = np.random.default_rng(0).normal(size=(2, 3, 5, 4)).astype(np.float32)
    np.testing.assert_allclose(prog.runtime("reference").predict(x=x), x @ np.swapaxes(x, -1, -2), rtol=1e-5)


# -- register-blocked (tiled) batched products --------------------------------------------------------
@pytest.mark.parametrize("form", ["attention", "values", "stored"])
@pytest.mark.parametrize("shape", [(4, 2), (2, 1), (8, 1)])
@pytest.mark.parametrize("k", [3, 4, 9])
def test_tiled_bmm_matches_reference(form: str, shape: tuple[int, int], k: int, force: Any, gl_runtime: Any):
    """Blocks of R rows inside one batch element (M = 8 rows each), B read at that element's rows:
    the forward products, their gradients' products (the transposed ones of a stored operand,
    a fused operand computed first) against the reference; N = 6 and 10 leave a column texel half
    past the row. A the batch transpose of a stored value (the values' gradient P.T @ dO) is read 4
    of its rows a texel, so only R = 4 and 8 tile it."""
    force(shape)
    b, m, n = 3, 8, 6 if k != 4 else 10
    prog = glcomp.compile(
        Batched(m, k, n, form), {"x": (b, m, k)}, loss=SumLoss(), target="webgl2", max_draw_buffers=8
    )
    if form != "stored":  # q.T @ v: A's K = 3, 4 or 9 rows a batch element, no R divides them all
        assert f"{shape[0]} x {shape[1]}" in tiled_shapes(prog)
    if form == "values" and shape[0] % 4 == 0:  # the gradient P.T @ dO reads P's rows of its element
        assert any("aofs" in s for s in build_bundle(prog).shaders.values())
    check(prog, gl_runtime, out_shape(form, b, m, k, n), seed=k)


def test_tiled_bmm_needs_blocks_inside_a_batch_element(force: Any) -> None:
    """M = 6 rows a batch element: 4-row blocks would straddle two elements, so no bmm is tiled."""
    force((4, 2))
    prog = glcomp.compile(Batched(6, 4, 8, "values"), {"x": (3, 6, 4)}, target="webgl2", max_draw_buffers=8)
    tiled = [s for s in build_bundle(prog).shaders.values() if "register-blocked" in s and "bofs" in s]
    assert tiled == []


def test_attention_products_are_tiled_at_realistic_sizes() -> None:
    """Causal attention at char-GPT small's sizes (batch 32, 64 steps, head 32), no forcing: the
    cost model tiles batched products of the step (the scores' and the values' gradients)."""
    prog = glcomp.compile(Attention(64, 32), {"x": (32, 64, 32)}, loss=SumLoss(), target="webgl2")
    batched = [s for s in build_bundle(prog).shaders.values() if "bofs" in s]
    assert len(batched) >= 2, prog.explain()
