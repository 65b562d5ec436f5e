"""Split K by the device's width: on a target that names the fragments a draw needs
(`Target.parallel_fragments`), a product with few output blocks and a long K runs its blocked
draw over S chunks of K, any block shape, A read transposed too (a weight gradient's x.T), the
gather adding the S partial products (glcomp/codegen/passes/tiling.py `_parallel_tiling`).

Forced shapes on small products (no draw or gather cost) check the shaders against the reference:
M, N not multiples of the block or of 4, both operand forms, transposed A, split loops, f16
storage. The choice tests check the GPU preset splits what the H200 ran short of fragments (the
per-head weight gradients of char-GPT medium) and leaves large products unsplit, and that
targets without a width keep the CPU rasterizers' rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import SumLoss

import glcomp
from codegen.test_matmul_tiled import Product, _matmul_kernel, check
from glcomp.codegen import cost
from glcomp.codegen.bundle import build_bundle
from glcomp.codegen.kernels import Kernel
from glcomp.codegen.layout import layout_for
from glcomp.codegen.passes import tiling
from glcomp.codegen.target import make_target
from glcomp.ir.graph import Graph

RTOL, ATOL = 1e-4, 1e-4
WIDE = 1 << 16  # every product below is short of fragments: K splits as far as the rule allows


@pytest.fixture
def force(monkeypatch: pytest.MonkeyPatch) -> Any:
    def apply(shape: tuple[int, int]) -> None:
        monkeypatch.setattr(tiling, "SHAPES", (shape,))
        monkeypatch.setattr(tiling, "SPLIT_SHAPES", ())
        monkeypatch.setattr(cost, "BLOCKED_DRAW", 0)
        monkeypatch.setattr(cost, "GATHER_FETCHES", 0)

    return apply


def blocks(prog: glcomp.Program) -> list[tuple[str, int]]:
    """(block shape, chunks of K) of every block shader of the bundle."""
    out = []
    for src in build_bundle(prog).shaders.values():
        for line in src.splitlines():
            if line.startswith("// register-blocked matmul: ") and "gather" not in line:
                shape = line.split(": ")[1].split(" output")[0]
                chunks = int(line.split("K in ")[1].split(" ")[0]) if "K in " in line else 1
                out.append((shape, chunks))
    return out


@pytest.mark.parametrize(
    "form, shape, m, k, n",
    [
        ("stored", (4, 1), 13, 256, 10),  # A = X.T, M % 4 = 1, N % 4 = 2
        ("stored", (8, 1), 9, 512, 37),  # two texels of X's row per step
        ("linear", (4, 2), 61, 512, 37),  # W.T, column texel pairs half past the row
    ],
)
def test_split_blocks_of_a_transposed_operand_match_the_reference(
    form, shape, m, k, n, force: Any, gl_runtime: Any
):
    force(shape)
    prog = glcomp.compile(
        Product(k, n, form, True),
        {"x": (k, m)},
        target="webgl2",
        max_draw_buffers=8,
        parallel_fragments=WIDE,
    )
    assert any(b == f"{shape[0]} x {shape[1]}" and chunks > 1 for b, chunks in blocks(prog))
    x = np.random.default_rng(m).normal(size=(k, m)).astype(np.float32)
    want = prog.runtime("reference").predict(x=x)
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(gl.predict(x=x), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "form, shape, m, k, n, storage, limits",
    [
        ("stored", (2, 2), 63, 256, 9, "f32", {}),
        ("linear", (8, 1), 61, 384, 10, "f32", {"max_loop_iterations": 4}),  # nested loops
        ("stored", (4, 1), 59, 256, 6, "f16", {}),
    ],
)
def test_split_blocks_train_like_the_reference(
    form, shape, m, k, n, storage, limits, force: Any, gl_runtime: Any
):
    """Forward and gradients (the gradients' own products split or not, by the same rule)."""
    force(shape)
    prog = glcomp.compile(
        Product(k, n, form),
        {"x": (m, k)},
        loss=SumLoss(),
        target="webgl2",
        max_draw_buffers=8,
        parallel_fragments=WIDE,
        storage=storage,
        **limits,
    )
    assert any(s == f"{shape[0]} x {shape[1]}" and c > 1 for s, c in blocks(prog))
    if storage == "f16":
        x = np.random.default_rng(k).normal(size=(m, k)).astype(np.float32)
        want = prog.runtime("reference").predict(x=x)
        with gl_runtime(prog) as gl:
            np.testing.assert_allclose(gl.predict(x=x), want, rtol=2e-2, atol=2e-1)
        return
    check(prog, gl_runtime, (m, n), seed=k)


def _weight_grad_kernel(m: int, k: int, n: int) -> tuple[Graph, Kernel, dict[int, Any]]:
    """x.T @ g with x (K, M) and g (K, N) stored: a Linear's weight gradient over K = B * T rows."""
    g = Graph()
    x = g.add_input("x", (k, m), "data")
    gy = g.add_input("g", (k, n), "data")
    xt = g.add("permute", [x], perm=(1, 0))
    c = g.add("matmul", (xt, gy))
    layouts = {v: layout_for(g.shape(v), 8192) for v in (x, gy, xt, c)}
    return g, Kernel("k0", [c], [xt], [x, gy], "matmul"), layouts


def test_the_gpu_preset_splits_weight_gradients_short_of_fragments() -> None:
    """char-GPT medium's per-head key/query/value weight gradients, (256 x 4096) @ (4096 x 64):
    unsplit, 4 x 1 blocks are 1,024 fragments looping 1,024 times; the preset splits K until the
    draw has about its 2^14 fragments."""
    g, kernel, layouts = _weight_grad_kernel(256, 4096, 64)
    t = tiling.choose_tiling(g, kernel, layouts, make_target("webgl2-gpu"))
    assert t is not None and t.a_form == "t" and t.R % 4 == 0
    fw, fh = t.grid
    assert t.S > 1 and fw * fh * t.S >= (1 << 14) // 2
    assert tiling.choose_tiling(g, kernel, layouts, make_target("webgl2")) is None or (
        tiling.choose_tiling(g, kernel, layouts, make_target("webgl2")).S == 1
    )


def test_a_product_with_fragments_enough_is_not_split() -> None:
    """A Linear over 4,096 rows into 1,024 features: 2^18 output texels fill the device."""
    g, kernel, layouts = _matmul_kernel(4096, 256, 1024)
    t = tiling.choose_tiling(g, kernel, layouts, make_target("webgl2-gpu"))
    assert t is not None and t.S == 1 and t.R * t.C == 8


@pytest.mark.parametrize("width", [None, 1 << 16])
def test_without_a_width_the_cpu_rule_holds(width: int | None) -> None:
    """conv_seed's Linear (16 x 4096 @ 4096 x 10, 40 output texels): the CPU rule splits it into
    32 one-texel chunks; a width splits it too (its blocks being few), whatever the shape."""
    g, kernel, layouts = _matmul_kernel(16, 4096, 10)
    t = tiling.choose_tiling(g, kernel, layouts, make_target("webgl2", parallel_fragments=width))
    assert t is not None and t.S > 1
    if width is None:
        assert (t.R, t.C, t.S) == (1, 1, 32)


def test_occupancy() -> None:
    wide = make_target("webgl2-gpu")
    assert cost.occupancy(1024, wide) == wide.parallel_fragments / 1024 == 16.0
    assert cost.occupancy(1 << 20, wide) == 1.0
    assert cost.occupancy(16, make_target("webgl2")) == 1.0  # no width: work alone decides
