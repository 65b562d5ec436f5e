"""Register-blocked (tiled) matmul kernels against the reference (glcomp/codegen/passes/tiling.py
chooses them, glcomp/codegen/families/matmul.py renders them).

The cost model keeps small products on the one-texel kernel, so these tests force tiling (no draw
or gather cost, one block shape at a time) on small shapes with M, N and K not multiples of the
block or of 4: rows past M and column texels past the row are clamped, the K % 4 tail runs on real
components only, components past N stay exactly zero. Both operand forms (x @ W with W stored as
(K, N), and a Linear's x @ W.T), split loops, texture rows wrapping, the gradients' products, and
the per-target choice (draw buffers, WebGL 1 keeps today's kernel).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import SumLoss

import glcomp
from glcomp import nn
from glcomp.codegen.bundle import build_bundle, load_bundle
from glcomp.codegen.kernels import Kernel
from glcomp.codegen.layout import layout_for
from glcomp.codegen.passes import tiling
from glcomp.codegen.target import make_target
from glcomp.ir.graph import Graph

RTOL, ATOL = 1e-4, 1e-5


class Product(nn.Module):
    """x @ w (w stored as (K, N)) or, for "linear", x @ w.T (w stored as (N, K)); with `transposed`,
    x.T instead of x (A the transpose of the stored input, as in a weight gradient)."""

    def __init__(self, k: int, n: int, form: str, transposed: bool = False) -> None:
        super().__init__()
        rng = np.random.default_rng(k * 100 + n)
        self.form, self.transposed = form, transposed
        self.w = nn.Parameter(rng.normal(size=(n, k) if form == "linear" else (k, n)).astype(np.float32))

    def forward(self, x: Any) -> Any:
        a = x.t() if self.transposed else x
        return a @ self.w.T if self.form == "linear" else a @ self.w


def tiled_shapes(prog: glcomp.Program) -> list[str]:
    """The block shapes of the bundle's tiled kernels, one entry per block shader."""
    out = []
    for src in build_bundle(prog).shaders.values():
        for line in src.splitlines():
            if line.startswith("// register-blocked matmul: ") and "gather" not in line:
                out.append(line.split(": ")[1].split(" output")[0])
    return out


def check(prog: glcomp.Program, gl_runtime: Any, out_shape: tuple[int, ...], seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=prog.inputs["x"].shape).astype(np.float32)
    y = rng.normal(size=out_shape).astype(np.float32)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        got = gl.predict(x=x)
        np.testing.assert_allclose(got, ref.predict(x=x), rtol=RTOL, atol=ATOL)
        grads, want = gl.gradients(x=x, y=y), ref.gradients(x=x, y=y)
        for name in want:
            np.testing.assert_allclose(grads[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.mark.parametrize(
    "form, shape, m, k, n",
    [
        ("stored", (8, 1), 13, 7, 10),  # M % 8, K % 4 = 3, N % 4 = 2
        ("stored", (4, 2), 11, 9, 37),  # column texels 10: the last pair is half past the row
        ("stored", (2, 2), 5, 2, 9),  # K < 4: no full step, the tail alone
        ("linear", (8, 1), 13, 9, 10),
        ("linear", (4, 2), 6, 22, 37),
        ("linear", (2, 1), 3, 1, 5),
    ],
)
def test_tiled_matmul_matches_reference(form, shape, m, k, n, force: Any, gl_runtime: Any):
    force(shape)
    prog = glcomp.compile(
        Product(k, n, form), {"x": (m, k)}, loss=SumLoss(), target="webgl2", max_draw_buffers=8
    )
    assert f"{shape[0]} x {shape[1]}" in tiled_shapes(prog)
    check(prog, gl_runtime, (m, n), seed=k)


@pytest.mark.parametrize(
    "form, shape, m, k, n",
    [
        ("stored", (4, 1), 7, 9, 6),  # M % 4 = 3 (the last texel of rows half past M), K % 4 = 1
        ("stored", (8, 1), 13, 6, 10),  # two texels of X's row per step, K % 4 = 2
        ("stored", (4, 2), 12, 3, 37),  # K < 4: the tail alone
        ("linear", (4, 1), 10, 11, 5),
        ("linear", (8, 1), 9, 8, 13),
    ],
)
def test_tiled_matmul_reads_a_transposed_operand(form, shape, m, k, n, force: Any, gl_runtime: Any):
    """A = X.T with X (K, M) stored (a weight gradient's x.T): each K step reads R / 4 texels of
    each of X's four rows, whose components are four of A's rows, instead of one component of a
    texel per row and step."""
    force(shape)
    prog = glcomp.compile(Product(k, n, form, True), {"x": (k, m)}, target="webgl2", max_draw_buffers=8)
    assert f"{shape[0]} x {shape[1]}" in tiled_shapes(prog)
    assert any("int kx = " in s for s in build_bundle(prog).shaders.values())
    x = np.random.default_rng(m).normal(size=(k, m)).astype(np.float32)
    want = prog.runtime("reference").predict(x=x)
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(gl.predict(x=x), want, rtol=RTOL, atol=ATOL)


def test_transposed_operand_never_splits_k(split_small: None, gl_runtime: Any) -> None:
    """Split K runs blocks of one row: a product whose A is a transpose keeps its one-texel kernel
    there rather than a split that could not read A's rows four at a time."""
    prog = glcomp.compile(Product(1024, 8, "stored", True), {"x": (1024, 3)}, target="webgl2")
    assert not tiled_shapes(prog)
    x = np.random.default_rng(3).normal(size=(1024, 3)).astype(np.float32)
    want = prog.runtime("reference").predict(x=x)
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(gl.predict(x=x), want, rtol=RTOL, atol=1e-4)


@pytest.mark.parametrize("form", ["stored", "linear"])
def test_tiled_matmul_split_loop_and_wrapping_rows(form: str, force: Any, gl_runtime: Any):
    """K = 130: rows of 33 texels in textures 32 or 64 wide (rows wrap); a loop limit of 4 splits
    the 32 texel steps into nested loops."""
    force((4, 2))
    prog = glcomp.compile(
        Product(130, 9, form),
        {"x": (7, 130)},
        loss=SumLoss(),
        target="webgl2",
        max_loop_iterations=4,
        max_draw_buffers=8,
    )
    assert tiled_shapes(prog)
    check(prog, gl_runtime, (7, 9))


def test_tiled_bundle_loads_and_trains(force: Any, gl_runtime: Any, tmp_path: Any):
    """A saved bundle with tiled draws passes the loader's checks and trains like the reference."""
    force((8, 1))
    prog = glcomp.compile(
        Product(12, 20, "linear"),
        {"x": (17, 12)},
        loss=SumLoss(),
        optimizer=glcomp.optim.SGD(lr=0.01),
        target="webgl2",
        max_draw_buffers=8,
    )
    bundle = load_bundle(build_bundle(prog).save(tmp_path / "b"))
    assert any(len(d["targets"]) == 8 for d in bundle.manifest["entries"]["predict"]["draws"])
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(17, 12)).astype(np.float32), rng.normal(size=(17, 20)).astype(np.float32)
    ref = prog.runtime("reference")
    with gl_runtime(bundle) as gl:
        for _ in range(2):
            np.testing.assert_allclose(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=RTOL)
        np.testing.assert_allclose(gl.predict(x=x), ref.predict(x=x), rtol=RTOL, atol=ATOL)


def test_webgl1_keeps_the_one_texel_kernel(force: Any, gl_runtime: Any):
    force((2, 1))
    prog = glcomp.compile(
        Product(9, 10, "linear"), {"x": (6, 9)}, loss=SumLoss(), target="webgl1", max_draw_buffers=8
    )
    assert tiled_shapes(prog) == []
    check(prog, gl_runtime, (6, 10))


def _matmul_kernel(m: int, k: int, n: int) -> tuple[Graph, Kernel, dict[int, Any]]:
    g = Graph()
    a = g.add_input("x", (m, k), "data")
    b = g.add_input("w", (k, n), "param")
    c = g.add("matmul", (a, b))
    layouts = {v: layout_for(g.shape(v), 4096) for v in (a, b, c)}
    return g, Kernel("k0", [c], [], [a, b], "matmul"), layouts


@pytest.mark.parametrize(
    "m, k, n, target, limits, want",
    [
        (512, 512, 512, "webgl2", {"max_draw_buffers": 8}, (8, 1)),  # fewest fetches per texel
        (512, 512, 512, "webgl2", {}, (4, 1)),  # 4 draw buffers: 4 x 1 beats 2 x 2
        (512, 512, 512, "webgl2", {"max_draw_buffers": 1}, None),
        (512, 512, 512, "webgl1", {"max_draw_buffers": 8}, None),
        (64, 128, 64, "webgl2", {"max_draw_buffers": 8}, (8, 1)),  # an mlp layer: pays (SwiftShader)
        (16, 64, 16, "webgl2", {"max_draw_buffers": 8}, None),  # a small one: the draw does not pay
        (64, 784, 32, "webgl2", {"max_draw_buffers": 8}, (8, 1)),  # long K: pays (7.4 -> 0.9 ms, llvmpipe)
        (8, 8, 8, "webgl2", {}, None),
    ],
)
def test_cost_model_choice(m, k, n, target, limits, want):
    g, kernel, layouts = _matmul_kernel(m, k, n)
    t = tiling.choose_tiling(g, kernel, layouts, make_target(target, **limits))
    assert (None if t is None else (t.R, t.C)) == want


class Epilogue(nn.Module):
    """relu(Linear(x)) or relu(x @ W + b): the product is fused into a bias and activation."""

    def __init__(self, k: int, n: int, form: str) -> None:
        super().__init__()
        self.p = Product(k, n, form)
        self.b = nn.Parameter(np.random.default_rng(n).normal(size=(n,)).astype(np.float32))

    def forward(self, x: Any) -> Any:
        return (self.p(x) + self.b).relu()


@pytest.mark.parametrize("form", ["stored", "linear"])
def test_tiled_matmul_with_fused_epilogue(form: str, force: Any, gl_runtime: Any):
    """The bias and activation are split off into a kernel of their own that reads the tiled
    product from its tiles (no gather draw, no product texture); gradients and the SGD update
    train like the reference."""
    force((4, 2))
    prog = glcomp.compile(
        Epilogue(11, 14, form),
        {"x": (9, 11)},
        loss=SumLoss(),
        optimizer=glcomp.optim.SGD(lr=0.05),
        target="webgl2",
        max_draw_buffers=8,
    )
    draws = build_bundle(prog).manifest["entries"]["predict"]["draws"]
    assert [len(d["targets"]) for d in draws] == [8, 1]  # block, epilogue gathering as it reads
    assert len(draws[1]["samplers"]) == 8 + 1  # the 8 tiles and the bias
    check(prog, gl_runtime, (9, 14), seed=3)
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(9, 11)).astype(np.float32), rng.normal(size=(9, 14)).astype(np.float32)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        for _ in range(2):
            np.testing.assert_allclose(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=RTOL)
        np.testing.assert_allclose(gl.predict(x=x), ref.predict(x=x), rtol=RTOL, atol=ATOL)


def test_a_product_fused_into_its_epilogue_is_costed_as_it_runs(gl_runtime: Any):
    """A product fused into its bias add loops over K for each element of a texel with a fetch of
    A and of B per multiply-add (tiling.FUSED_FETCHES), not the one-texel kernel's five fetches
    per texel and K step: char-GPT's lm_head (512 x 64 @ 64 x 58, + bias) stayed fused that way
    (29 ms of a 340 ms step in SwiftShader) where a blocked product pays. At the former blocked
    draw cost (2^20) the split and tiled product is chosen; the GL run matches the reference."""
    kw = {"loss": SumLoss(), "target": "webgl2", "blocked_draw_cost": 1 << 20}
    glcomp.manual_seed(0)
    prog = glcomp.compile(nn.Linear(64, 58), {"x": (512, 64)}, **kw)
    draws = build_bundle(prog).manifest["entries"]["predict"]["draws"]
    assert [d["kernel"].split("_", 1)[1] for d in draws] == ["add_mm", "add"]  # block, then epilogue
    assert len(draws[0]["targets"]) == 4
    check(prog, gl_runtime, (512, 58), seed=5)
    # what the model weighs: the fused kernel's fetches outweigh the blocks', the one-texel's do not
    g, kernel, layouts = _matmul_kernel(512, 64, 58)
    target = make_target("webgl2", blocked_draw_cost=1 << 20)
    assert tiling.choose_tiling(g, kernel, layouts, target, extra_draws=1) is None
    assert tiling.choose_tiling(g, kernel, layouts, target, 1, tiling.FUSED_FETCHES) is not None


# -- split K ----------------------------------------------------------------------------------------
@pytest.fixture
def split_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Split K from 4 steps of 4 on (the default: 256 steps into at most 256 output texels)."""
    monkeypatch.setattr(tiling, "LONG_STEPS", 4)


def split_counts(prog: glcomp.Program) -> list[int]:
    """S of every split-K gather shader of the bundle."""
    out = []
    for src in build_bundle(prog).shaders.values():
        for line in src.splitlines():
            if line.startswith("// register-blocked matmul: gather") and "chunks of K" in line:
                out.append(int(line.split("the sum of ")[1].split(" ")[0]))
    return out


@pytest.mark.parametrize(
    "form, m, k, n, chunks",
    [
        ("stored", 3, 64, 10, 4),  # 16 steps: 4 chunks of 4 texels
        ("linear", 5, 40, 7, 2),  # 10 steps: 2 chunks of 5 texels (10 is not a multiple of 4)
        ("linear", 2, 96, 5, 4),
    ],
)
def test_split_k_matches_reference(form, m, k, n, chunks, split_small: None, gl_runtime: Any):
    """Partial products over chunks of K, added by the gather, equal the one-loop product."""
    prog = glcomp.compile(Product(k, n, form), {"x": (m, k)}, loss=SumLoss(), target="webgl2")
    assert chunks in split_counts(prog)
    check(prog, gl_runtime, (m, n), seed=k)


def test_split_k_with_nested_loops(split_small: None, gl_runtime: Any):
    """A loop limit of 2 nests both the block draw's and the gather's loops."""
    prog = glcomp.compile(
        Product(64, 9, "linear"), {"x": (3, 64)}, loss=SumLoss(), target="webgl2", max_loop_iterations=2
    )
    assert split_counts(prog)
    check(prog, gl_runtime, (3, 9))


class FlatLinear(nn.Module):
    """A Linear after a Flatten: A is a reshape of a stored (m, c, h, w) input."""

    def __init__(self, features: int, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(features, n)

    def forward(self, x: Any) -> Any:
        return self.fc(x.reshape(x.shape[0], -1))


@pytest.mark.parametrize("w, split", [(8, True), (6, False)])
def test_split_k_reads_a_flatten_in_place(w: int, split: bool, gl_runtime: Any):
    """A Linear into 10 classes from 1024 features (the default thresholds) splits K and reads the
    flattened input texel by texel when its last axis is whole texels (8); with 6 it does not."""
    glcomp.manual_seed(0)
    prog = glcomp.compile(FlatLinear(8 * 16 * w, 10), {"x": (4, 8, 16, w)}, loss=SumLoss(), target="webgl2")
    assert bool(split_counts(prog)) == split
    check(prog, gl_runtime, (4, 10))


@pytest.mark.parametrize(
    "m, k, n, want",
    [
        (16, 4096, 10, (1, 1, 32)),  # conv_seed's Linear: 40 texels, 1024 steps -> 32 chunks of 32
        (4, 1000, 4, None),  # 250 steps: one loop, and too small to tile
        (16, 1000, 10, (8, 1, 1)),  # 250 steps: one loop, register-blocked
        (64, 4096, 64, (8, 1, 1)),  # 1024 output texels: enough fragments, register-blocked
        (16, 4098, 10, (8, 1, 1)),  # K not a multiple of 4: never split (blocked)
    ],
)
def test_split_k_choice(m, k, n, want):
    g, kernel, layouts = _matmul_kernel(m, k, n)
    t = tiling.choose_tiling(g, kernel, layouts, make_target("webgl2", max_draw_buffers=8))
    assert (None if t is None else (t.R, t.C, t.S)) == want


# -- operands that are views of stored rows ----------------------------------------------------------
class SequenceLinear(nn.Module):
    """A Linear over (B, T, C) (as in a transformer's blocks): the product reads x as (B * T, C),
    a reshape of the stored input with the same rows, and its weight gradient g.T @ x reads both
    through such reshapes."""

    def __init__(self, c: int, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(c, n)

    def forward(self, x: Any) -> Any:
        return self.fc(x).relu()


@pytest.mark.parametrize("c, n", [(12, 20), (7, 9)])  # C a multiple of 4 or not (padded rows)
def test_products_over_row_views_are_tiled(c: int, n: int, force: Any, gl_runtime: Any):
    force((4, 2))
    shape = (3, 5, c)
    prog = glcomp.compile(SequenceLinear(c, n), {"x": shape}, loss=SumLoss(), max_draw_buffers=8)
    per_entry = {e: tiled_shapes_of(prog, e) for e in ("predict", "gradients")}
    assert per_entry["predict"] >= 1, per_entry  # x @ W.T with x a (B * T, C) view of the input
    assert per_entry["gradients"] >= 2, per_entry  # also the weight gradient g.T @ x
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=shape).astype(np.float32), rng.normal(size=(3, 5, n)).astype(np.float32)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(gl.predict(x=x), ref.predict(x=x), rtol=RTOL, atol=ATOL)
        grads, want = gl.gradients(x=x, y=y), ref.gradients(x=x, y=y)
        for name in want:
            np.testing.assert_allclose(grads[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)


def tiled_shapes_of(prog: glcomp.Program, entry: str) -> int:
    """How many draws of `entry` are register-blocked products (block draws)."""
    bundle = build_bundle(prog)
    mark = "// register-blocked matmul: "
    blocked = {
        name.removesuffix(".frag")
        for name, src in bundle.shaders.items()
        if any(line.startswith(mark) and "gather" not in line for line in src.splitlines())
    }
    return sum(d["program"] in blocked for d in bundle.manifest["entries"][entry]["draws"])


class FlattenLinear(nn.Module):
    """A Linear over a Flatten of an (N, C, H, W) value: the product reads the stored 4-D texture
    through a texel view (rows of W elements there, of C * H * W in the product)."""

    def __init__(self, c: int, hw: int, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(c * hw * hw, n)

    def forward(self, x: Any) -> Any:
        return self.fc(x.flatten(1))


@pytest.mark.parametrize("shape", [(4, 2), (8, 1)])
def test_products_over_texel_views_read_the_product_rows(shape: tuple[int, int], force: Any, gl_runtime: Any):
    """Regression: the tiled kernel stepped the operands' rows by the stored texture's row length
    (2 texels for a last axis of 8) instead of the product's (C * H * W / 4), so the weight
    gradient g.T @ flatten(x) of a Linear after a Flatten came out wrong on GL."""
    force(shape)
    prog = glcomp.compile(FlattenLinear(3, 8, 6), {"x": (8, 3, 8, 8)}, loss=SumLoss(), max_draw_buffers=8)
    assert tiled_shapes_of(prog, "gradients") >= 2
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(8, 3, 8, 8)).astype(np.float32), rng.normal(size=(8, 6)).astype(np.float32)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(gl.predict(x=x), ref.predict(x=x), rtol=RTOL, atol=ATOL)
        grads, want = gl.gradients(x=x, y=y), ref.gradients(x=x, y=y)
        for name in want:
            np.testing.assert_allclose(grads[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)


# -- fused operands that are no view of a stored texture --------------------------------------------
class Heads(nn.Module):
    """Attention's output projection: heads (stored, one product each) concatenated along the
    features, projected by a Linear and added to the residual. The concatenation is fused into
    the projection's product (and into its weight gradient's), no view of a stored texture."""

    def __init__(self, c: int, heads: int, out: int, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.heads = nn.ModuleList([nn.Linear(c, c // heads) for _ in range(heads)])
        self.proj = nn.Linear(c, out)

    def forward(self, x: Any) -> Any:
        cat = glcomp.cat([h(x).relu() for h in self.heads], dim=-1)
        y = self.proj(cat)
        return y + x if self.kind == "residual" else y


def split_off_inputs(prog: glcomp.Program, entry: str) -> list[str]:
    return [
        d["kernel"] for d in build_bundle(prog).manifest["entries"][entry]["draws"] if "_in" in d["kernel"]
    ]


@pytest.mark.parametrize("kind", ["residual", "plain"])
def test_fused_operand_is_computed_first_and_the_product_tiled(kind: str, force: Any, gl_runtime: Any):
    """The concatenation is computed by a kernel of its own (once: the weight gradient reads it
    too) and the projection and its weight gradient are tiled; predict, gradients and Adam steps agree with
    the reference (two heads of 6 columns: K = 12, not a multiple of the 8-row block)."""
    force((4, 2))
    c, out = 12, 12 if kind == "residual" else 10
    prog = glcomp.compile(
        Heads(c, 2, out, kind),
        {"x": (9, c)},
        loss=SumLoss(),
        optimizer=glcomp.optim.Adam(lr=0.01),
        target="webgl2",
        max_draw_buffers=8,
    )
    assert split_off_inputs(prog, "predict"), "the concatenation is not computed by a kernel of its own"
    # computed once, for the projection, and read from its texture by the weight gradient's product
    assert len(split_off_inputs(prog, "gradients")) == 1
    assert "4 x 2" in tiled_shapes(prog)
    check(prog, gl_runtime, (9, out), seed=5)
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(9, c)).astype(np.float32), rng.normal(size=(9, out)).astype(np.float32)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        for _ in range(2):
            np.testing.assert_allclose(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=RTOL)
        np.testing.assert_allclose(gl.predict(x=x), ref.predict(x=x), rtol=RTOL, atol=ATOL)


def test_fused_operand_stays_fused_when_tiling_does_not_pay() -> None:
    """A product too small for its tiles to pay for the draws keeps the concatenation fused."""
    prog = glcomp.compile(Heads(8, 2, 8, "residual"), {"x": (4, 8)}, loss=SumLoss(), target="webgl2")
    assert split_off_inputs(prog, "predict") == [] and tiled_shapes(prog) == []
