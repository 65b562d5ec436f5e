"""Loop kernels that compute a whole output texel per fragment (`root4`), against the reference.

Each operand layout that selects a different vec4 path is exercised. matmul: A and B stored and
read along their packed axes, B the transpose of a stored Linear weight (dot with W's rows), fused
operands (scalar calls shared by the four outputs), K with every remainder mod 4; epilogues read
through elementwise ops, a transpose (the SGD update of a Linear weight) or a reshape (Flatten).
conv2d, its input and weight gradients, pooling and reductions: strides, paddings and kernel sizes
whose taps cross texel and row boundaries, negative inputs where a zero let in would change a max.
Loops are split into nested loops where the limit allows. The shaders must take the vec4 path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import SumLoss

import glcomp
from glcomp import nn
from glcomp.codegen.bundle import build_bundle
from glcomp.ir.tensor import prim

RTOL, ATOL = 1e-4, 1e-5


class Product(nn.Module):
    """x @ w, x.T-free; `form` picks how the right operand reaches the matmul."""

    def __init__(self, k: int, n: int, form: str) -> None:
        super().__init__()
        rng = np.random.default_rng(k * 100 + n)
        self.form = form
        shape = (n, k) if form == "linear" else (k, n)
        self.w = nn.Parameter(rng.normal(size=shape).astype(np.float32))
        self.b = nn.Parameter(rng.normal(size=(n,)).astype(np.float32))

    def forward(self, x: Any) -> Any:
        if self.form == "linear":  # B = W.T: the transposed stored weight
            return x @ self.w.T + self.b
        if self.form == "fused_b":  # B is a fused expression of a stored tensor
            return x @ (self.w * 2.0)
        if self.form == "fused_a":  # A is a fused expression, B stored
            return (x * 0.5) @ self.w
        return x @ self.w  # both stored, read along their packed axes


def check(prog: glcomp.Program, gl_runtime: Any, out_shape: tuple[int, ...], seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=prog.inputs["x"].shape).astype(np.float32)
    y = rng.normal(size=out_shape).astype(np.float32)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(gl.predict(x=x), ref.predict(x=x), rtol=RTOL, atol=ATOL)
        got, want = gl.gradients(x=x, y=y), ref.gradients(x=x, y=y)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)


def vec4_calls(prog: glcomp.Program) -> int:
    """How many shaders of the bundle compute a loop node a texel at a time."""
    return sum("_4(" in src for name, src in build_bundle(prog).shaders.items() if name.endswith(".frag"))


@pytest.mark.parametrize(
    "form, k",  # K % 4 takes every value; K < 4 has no full step
    [
        ("stored", 1),
        ("stored", 4),
        ("stored", 6),
        ("linear", 3),
        ("linear", 9),
        ("fused_b", 5),
        ("fused_a", 7),
    ],
)
def test_matmul_vec4_matches_reference(form: str, k: int, dialect: str, gl_runtime: Any):
    m, n = 3, 6
    prog = glcomp.compile(Product(k, n, form), {"x": (m, k)}, loss=SumLoss(), target=dialect)
    assert vec4_calls(prog) >= 1
    check(prog, gl_runtime, (m, n), seed=k)


@pytest.mark.parametrize("form", ["stored", "linear"])
def test_matmul_vec4_split_loop(form: str, dialect: str, gl_runtime: Any):
    """K // 4 = 5 texel steps under a loop limit of 2: nested loops, masked last iterations."""
    prog = glcomp.compile(
        Product(22, 5, form), {"x": (4, 22)}, loss=SumLoss(), target=dialect, max_loop_iterations=2
    )
    assert vec4_calls(prog) >= 1
    check(prog, gl_runtime, (4, 5))


def test_matmul_vec4_textures_wider_than_rows(dialect: str, gl_runtime: Any):
    """Rows of 33 texels in textures 32 texels wide: cursors wrap to the next texture row."""
    prog = glcomp.compile(Product(130, 9, "linear"), {"x": (5, 130)}, loss=SumLoss(), target=dialect)
    assert vec4_calls(prog) >= 1
    check(prog, gl_runtime, (5, 9))


@pytest.mark.parametrize(
    "c, o, size, k, stride, pad, bias",
    [
        (3, 4, 6, 3, 1, 1, True),  # taps reach one texel left and right of the output texel
        (2, 3, 9, 5, 1, 2, True),
        (2, 2, 10, 7, 1, 3, False),  # rows of 10: taps past the row end read as zero
        (3, 5, 7, 3, 2, 1, True),  # stride 2: the taps of four outputs span three texels
        (2, 3, 12, 5, 3, 2, False),
    ],
)
def test_conv2d_vec4_matches_reference(c, o, size, k, stride, pad, bias, dialect: str, gl_runtime: Any):
    glcomp.manual_seed(3)
    model = nn.Conv2d(c, o, k, stride=stride, padding=pad, bias=bias)
    prog = glcomp.compile(model, {"x": (2, c, size, size)}, loss=SumLoss(), target=dialect)
    assert vec4_calls(prog) >= 1
    out = (size + 2 * pad - k) // stride + 1
    check(prog, gl_runtime, (2, o, out, out), seed=k)


class ScaledConv(nn.Module):
    """conv2d(x * 2): the input is a fused expression, read by scalar calls."""

    def __init__(self, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, stride=stride, padding=1)

    def forward(self, x: Any) -> Any:
        return self.conv(x * 2.0)


@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_vec4_fused_input(stride: int, dialect: str, gl_runtime: Any):
    glcomp.manual_seed(9)
    prog = glcomp.compile(ScaledConv(stride), {"x": (2, 2, 7, 7)}, loss=SumLoss(), target=dialect)
    sources = [s for name, s in build_bundle(prog).shaders.items() if name.endswith(".frag")]
    assert any("wok0_0" in s for s in sources)  # the scalar-input form of root4
    out = (7 + 2 - 3) // stride + 1
    check(prog, gl_runtime, (2, 3, out, out))


def test_conv2d_vec4_split_loop(dialect: str, gl_runtime: Any):
    """5 input channels under a loop limit of 2: nested loops, cursors stop at the last channel."""
    glcomp.manual_seed(4)
    model = nn.Conv2d(5, 3, 3, padding=1)
    prog = glcomp.compile(model, {"x": (1, 5, 6, 6)}, loss=SumLoss(), target=dialect, max_loop_iterations=2)
    assert vec4_calls(prog) >= 1
    check(prog, gl_runtime, (1, 3, 6, 6))


@pytest.mark.parametrize(
    "k, stride, pad",
    [(3, 1, 1), (5, 1, 0), (2, 1, 1), (3, 2, 1)],  # stride 2: tests/codegen/test_strided_input_grad.py
)
def test_conv2d_input_grad_vec4_matches_reference(k, stride, pad, dialect: str, gl_runtime: Any):
    """The second convolution's input gradient (fused into the first layer's tanh derivative)."""
    glcomp.manual_seed(5)
    model = nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1), nn.Tanh(), nn.Conv2d(3, 4, k, stride=stride, padding=pad)
    )
    prog = glcomp.compile(model, {"x": (2, 2, 9, 9)}, loss=SumLoss(), target=dialect)
    sources = [s for name, s in build_bundle(prog).shaders.items() if name.endswith(".frag")]
    assert any("cg0_0x" in s for s in sources)  # g read texel-wise
    out = (9 + 2 * pad - k) // stride + 1
    check(prog, gl_runtime, (2, 4, out, out), seed=k)


class Gram(nn.Module):
    """x.T @ (x * w): A is the transpose of the stored input (a weight gradient's x.T)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(np.random.default_rng(n).normal(size=(n,)).astype(np.float32))

    def forward(self, x: Any) -> Any:
        return x.T @ (x * self.w)


@pytest.mark.parametrize("k, n", [(3, 6), (9, 5), (22, 7)])  # K % 4 = 3, 1, 2; M = N odd or even
def test_matmul_vec4_reads_a_transposed_stored_operand(k: int, n: int, dialect: str, gl_runtime: Any):
    """A = S.T of a stored (K, M) texture: A's texel along K is one component of four texels of S
    (cursors stepped four rows a time, no division in the loop), tail on the real rows only; the
    gradients' products read transposed operands too."""
    prog = glcomp.compile(Gram(n), {"x": (k, n)}, loss=SumLoss(), target=dialect)
    shaders = build_bundle(prog).shaders.values()
    assert any("int ac = imod(i0, 4);" in s for s in shaders)
    check(prog, gl_runtime, (n, n), seed=k)


@pytest.mark.parametrize("batch, k, n", [(5, 7, 6)])
def test_linear_weight_update_vec4_matches_reference(batch, k, n, dialect: str, gl_runtime: Any):
    """SGD on Linear layers: the new weight reads the product x.T @ g transposed (root4t)."""
    glcomp.manual_seed(6)
    model = nn.Sequential(nn.Linear(k, 8), nn.ReLU(), nn.Linear(8, n))
    prog = glcomp.compile(
        model, {"x": (batch, k)}, loss=SumLoss(), optimizer=glcomp.optim.SGD(lr=0.1), target=dialect
    )
    assert sum("glc_pick(glc_c_" in s and "csx" in s for s in build_bundle(prog).shaders.values()) >= 1
    rng = np.random.default_rng(batch)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        for _ in range(2):
            x = rng.normal(size=(batch, k)).astype(np.float32)
            y = rng.normal(size=(batch, n)).astype(np.float32)
            np.testing.assert_allclose(
                gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=RTOL, atol=ATOL
            )
        want = ref.state_dict()
        for name, value in gl.state_dict().items():
            np.testing.assert_allclose(value, want[name], rtol=RTOL, atol=ATOL, err_msg=name)


class Reduce(nn.Module):
    def __init__(self, op: str, axes: tuple[int, ...]) -> None:
        super().__init__()
        self.op, self.axes = op, axes

    def forward(self, x: Any) -> Any:
        return prim(self.op, x, axes=self.axes)


@pytest.mark.parametrize(
    "op, shape, axes",
    [
        ("sum", (9, 6), (0,)),  # last axis kept: one texel per reduced row (a bias gradient)
        ("max", (3, 4, 5), (0, 1)),
        ("max", (4, 3, 6), (1, 2)),  # last axis reduced: contiguous texel runs, padding masked
        ("sum", (2, 3, 4, 5), (0, 2, 3)),  # a conv bias gradient: outer loop over the batch
        ("max", (7,), (0,)),
    ],
)
def test_reduce_vec4_matches_reference(op, shape, axes, dialect: str, gl_runtime: Any):
    """All inputs negative, so a max that let a zero of the row padding in would be wrong; loops
    limited to 3 iterations, so the texel loops are split too."""
    prog = glcomp.compile(Reduce(op, axes), {"x": shape}, target=dialect, max_loop_iterations=3)
    assert vec4_calls(prog) >= 1
    x = -np.random.default_rng(len(shape)).uniform(0.5, 2.0, size=shape).astype(np.float32)
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(
            gl.predict(x=x), prog.runtime("reference").predict(x=x), rtol=RTOL, atol=ATOL
        )


class FusedReduce(Reduce):
    """The reduction of an elementwise expression fused into its kernel (BatchNorm's sums of its
    backward's products): no stored input to walk, the expression's vec4 function read instead."""

    def forward(self, x: Any) -> Any:
        return prim(self.op, x * 2.0 - 0.5, axes=self.axes)


@pytest.mark.parametrize(
    "op, shape, axes",
    [
        ("sum", (2, 3, 4, 5), (3,)),  # one row of 5: the last texel's padding masked
        ("max", (3, 6), (1,)),  # negative elements: a padding zero let in would win
        ("sum", (2, 3, 4, 8), (2, 3)),  # whole texels, another reduced axis before the last
        ("max", (4, 3, 7), (0, 2)),  # a kept axis between the reduced ones
        ("sum", (5, 2, 3), (0, 1, 2)),
    ],
)
@pytest.mark.parametrize("storage", ["f32", "f16"])
def test_reduce_vec4_of_a_fused_input_over_the_last_axis(
    op, shape, axes, storage, dialect: str, gl_runtime: Any
):
    """Mode "F": a texel of the fused expression a step (4 * col), the other reduced axes decomposed
    from the same index, loops limited to 3 iterations so they are split too."""
    prog = glcomp.compile(
        FusedReduce(op, axes), {"x": shape}, target=dialect, max_loop_iterations=3, storage=storage
    )
    assert any("4 * col)" in src for src in build_bundle(prog).shaders.values())
    x = -np.random.default_rng(len(shape) + len(axes)).uniform(0.5, 2.0, size=shape).astype(np.float32)
    tol = {"rtol": 2e-3, "atol": 2e-3} if storage == "f16" else {"rtol": RTOL, "atol": ATOL}
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(gl.predict(x=x), prog.runtime("reference").predict(x=x), **tol)


@pytest.mark.parametrize("k, pad", [(3, 1), (5, 0), (7, 3)])  # KW = 7: two output texels per kernel row
def test_conv2d_weight_grad_vec4_matches_reference(k, pad, dialect: str, gl_runtime: Any):
    """The weight gradient (fused into the SGD update) walks g's rows a texel at a time."""
    glcomp.manual_seed(8)
    model = nn.Conv2d(2, 3, k, padding=pad)
    prog = glcomp.compile(
        model, {"x": (2, 2, 9, 9)}, loss=SumLoss(), optimizer=glcomp.optim.SGD(lr=0.1), target=dialect
    )
    assert any("vec4 G = glc_texel" in s for s in build_bundle(prog).shaders.values())
    rng = np.random.default_rng(k)
    out = 9 + 2 * pad - k + 1
    x = rng.normal(size=(2, 2, 9, 9)).astype(np.float32)
    y = rng.normal(size=(2, 3, out, out)).astype(np.float32)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        got, want = gl.gradients(x=x, y=y), ref.gradients(x=x, y=y)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)
        gl.train_step(x=x, y=y)
        ref.train_step(x=x, y=y)
        want = ref.state_dict()
        for name, value in gl.state_dict().items():
            np.testing.assert_allclose(value, want[name], rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.mark.parametrize("size", [4, 6])  # rows of 4: "flat" cache; rows of 6 straddle texels: scalar
def test_linear_input_grad_through_flatten(size: int, dialect: str, gl_runtime: Any):
    """Conv, ReLU, Flatten, Linear: the Linear's input gradient is read through a reshape back to
    the conv's shape (and the ReLU mask), one texel of the product per output texel."""
    glcomp.manual_seed(10)
    model = nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * size * size, 5)
    )
    prog = glcomp.compile(model, {"x": (2, 2, size, size)}, loss=SumLoss(), target=dialect)
    sources = [s for name, s in build_bundle(prog).shaders.items() if name.endswith(".frag")]
    assert any("int glc_f" in s for s in sources) == (size % 4 == 0)
    check(prog, gl_runtime, (2, 5))


@pytest.mark.parametrize(
    "kind, size, k, stride, pad",
    [
        ("max", 8, 2, 2, 0),
        ("max", 7, 3, 2, 1),
        ("avg", 9, 3, 1, 1),
        ("max", 11, 2, 2, 1),
        ("avg", 10, 3, 3, 1),
    ],
)
def test_pool_vec4_matches_reference(kind, size, k, stride, pad, dialect: str, gl_runtime: Any):
    """Negative inputs: a max pool that let a padded or out-of-image zero in would be wrong."""
    model = (nn.MaxPool2d if kind == "max" else nn.AvgPool2d)(k, stride=stride, padding=pad)
    prog = glcomp.compile(model, {"x": (2, 3, size, size)}, target=dialect)
    assert vec4_calls(prog) >= 1
    x = -np.random.default_rng(size).uniform(0.5, 2.0, size=(2, 3, size, size)).astype(np.float32)
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(
            gl.predict(x=x), prog.runtime("reference").predict(x=x), rtol=RTOL, atol=ATOL
        )


@pytest.mark.parametrize(
    "c, h, w, kernel, fast",
    [
        (3, 8, 8, (2, 2), True),
        (2, 13, 8, (3, 2), True),  # the last row lies in no window: its gradient is zero
        (2, 8, 12, (2, 4), True),
        (2, 6, 8, (1, 1), True),
        (2, 8, 6, (2, 2), False),  # rows of 6: not whole texels, the scalar form
        (2, 9, 8, (3, 3), False),  # KW = 3 does not divide 4
    ],
)
def test_max_pool_grad_texel_form_is_the_scalar_forms_bits(
    c, h, w, kernel, fast, dialect: str, gl_runtime: Any, monkeypatch: pytest.MonkeyPatch
):
    """Windows that do not overlap (stride = kernel, no padding): the input gradient a texel at a
    time (KH reads of the input per texel) equals the scalar form (each tap re-finding the maximum
    of every window it could lie in) bit for bit, and the reference. Inputs with ties (a few
    levels) and negatives: the first maximum of a window, row-major, takes the gradient."""
    import dataclasses

    from glcomp.codegen.families import base

    glcomp.manual_seed(4)
    model = nn.Sequential(
        nn.Conv2d(c, c, 1),
        nn.MaxPool2d(kernel),
        nn.Flatten(),
        nn.Linear(c * (h // kernel[0]) * (w // kernel[1]), 3),
    )
    prog = glcomp.compile(model, {"x": (2, c, h, w)}, loss=SumLoss(), target=dialect)
    texel = [s for s in build_bundle(prog).shaders.values() if "bool hok = ho <" in s]
    assert bool(texel) == fast
    rng = np.random.default_rng(h * w)
    x = (rng.integers(-3, 3, size=(2, c, h, w)) / 2).astype(np.float32)
    y = rng.normal(size=(2, 3)).astype(np.float32)
    with gl_runtime(prog) as gl:
        got = gl.gradients(x=x, y=y)
    want = prog.runtime("reference").gradients(x=x, y=y)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)
    low = base.LOWERINGS["max_pool2d_grad"]
    monkeypatch.setitem(base.LOWERINGS, "max_pool2d_grad", dataclasses.replace(low, root4=None))
    scalar = glcomp.compile(model, {"x": (2, c, h, w)}, loss=SumLoss(), target=dialect)
    assert not [s for s in build_bundle(scalar).shaders.values() if "bool hok = ho <" in s]
    with gl_runtime(scalar) as gl:
        slow = gl.gradients(x=x, y=y)
    for name in got:
        np.testing.assert_array_equal(got[name], slow[name], err_msg=name)


class Reshaped(nn.Module):
    """x.reshape(6, 8) @ w.reshape(8, 5): operands are reshapes of stored tensors that keep the last
    axis, so their rows are the stored rows and both are read texel-wise."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(np.random.default_rng(11).normal(size=(2, 4, 5)).astype(np.float32))

    def forward(self, x: Any) -> Any:
        return x.reshape(6, 8) @ self.w.reshape(8, 5)


def test_matmul_vec4_reads_reshaped_operands(dialect: str, gl_runtime: Any):
    prog = glcomp.compile(Reshaped(), {"x": (2, 3, 8)}, loss=SumLoss(), target=dialect)
    sources = [s for name, s in build_bundle(prog).shaders.items() if name.endswith(".frag")]
    assert any("vec4 a = glc_texel" in s and "vec4 b0 = glc_texel" in s for s in sources)
    check(prog, gl_runtime, (6, 5))
