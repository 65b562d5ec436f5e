"""Fused elementwise kernels compute a whole output texel per fragment (vec4 functions), against the
reference.

Chains with broadcasts (a bias per column, a value per row, a scalar), views that keep texels whole
(reshapes to the same row length, permutes of leading axes, slices at aligned offsets) and views
that do not (gathered per component), NaN and inf, comparison masks and where, dropout masks from
the counter hash (bit-exact), multi-target kernels (Adam), textures split into pages, fused operands
of loop kernels (matmul, reductions), in both GLSL dialects. `texel_reads` counts the texture reads
one fragment runs (calls expanded through the shader's functions): one per stored operand texel,
where the per-component evaluation of a fused root read each four times.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from conftest import SumLoss

import glcomp
import glcomp.runtime.gl as gl_module
from glcomp import nn, optim
from glcomp.codegen.bundle import build_bundle
from glcomp.ir.interpret import evaluate
from glcomp.ir.tensor import prim
from glcomp.nn import functional as F

RTOL, ATOL = 1e-5, 1e-6


class Fn(nn.Module):
    """forward(x) = fn(x, self) with a bias per column, a weight per row and a scalar parameter."""

    def __init__(self, fn: Any, rows: int, cols: int) -> None:
        super().__init__()
        rng = np.random.default_rng(rows * 10 + cols)
        self.fn = fn
        self.b = nn.Parameter(rng.normal(size=(cols,)).astype(np.float32))
        self.r = nn.Parameter(rng.normal(size=(rows, 1)).astype(np.float32))
        self.s = nn.Parameter(np.float32(0.75))

    def forward(self, x: Any) -> Any:
        return self.fn(x, self)


_FUNCTION = re.compile(r"^(?:float|vec4|vec2|int|bool|void) (\w+)\([^)]*\) \{", re.MULTILINE)


def texel_reads(source: str) -> int:
    """Texture reads one fragment of the shader runs, loops counted once: calls expanded through
    the functions they call (GLSL has no recursion), from main()."""
    bodies: dict[str, str] = {}
    for m in _FUNCTION.finditer(source):
        depth, i = 0, m.end() - 1
        while True:
            depth += {"{": 1, "}": -1}.get(source[i], 0)
            i += 1
            if depth == 0:
                break
        bodies.setdefault(m.group(1), "")
        bodies[m.group(1)] += source[m.end() : i - 1]
    memo: dict[str, int] = {}

    def reads(name: str) -> int:
        if name not in memo:
            if name == "glc_texel":
                memo[name] = 1
            else:
                calls = re.findall(r"\b(\w+)\(", bodies[name])
                memo[name] = sum(reads(c) for c in calls if c in bodies)
        return memo[name]

    return reads("main")


def fragment_shaders(prog: glcomp.Program) -> list[str]:
    return [s for name, s in build_bundle(prog).shaders.items() if name.endswith(".frag")]


def check(prog: glcomp.Program, gl_runtime: Any, out_shape: tuple[int, ...], x: np.ndarray) -> None:
    y = np.random.default_rng(1).normal(size=out_shape).astype(np.float32)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(gl.predict(x=x), ref.predict(x=x), rtol=RTOL, atol=ATOL)
        got, want = gl.gradients(x=x, y=y), ref.gradients(x=x, y=y)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)


CHAINS = {
    # a bias per column, a weight per row (splatted), a scalar
    "broadcast": lambda x, m: ((x * m.s + m.b) * m.r).tanh() - (x * 0.5).sigmoid(),
    "transcendental": lambda x, m: (x * x + 1.0).log() + (x * m.b).exp() / (x.abs() + 2.0).sqrt(),
    "max_relu": lambda x, m: F.relu(x - m.b).maximum(x * m.r) + x.erf(),
    "masks": lambda x, m: glcomp.where(x > m.b, x * m.s, -x) + (x == x.detach()) * 0.25 + (x <= m.r) * x,
}


@pytest.mark.parametrize(
    "chain, shape",  # rows of 6: the last texel half padding
    [("broadcast", (3, 6)), ("transcendental", (5, 8)), ("max_relu", (3, 6)), ("masks", (3, 6))],
)
def test_elementwise_chain_matches_reference(
    chain: str, shape: tuple[int, int], dialect: str, gl_runtime: Any
) -> None:
    model = Fn(CHAINS[chain], *shape)
    prog = glcomp.compile(model, {"x": shape}, loss=SumLoss(), target=dialect)
    sources = fragment_shaders(prog)
    predict = [s for s in sources if "float glc_root" not in s and "vec4 glc_root0_4" in s]
    assert predict, "no kernel of the chain computes its texel with vec4 functions"
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    check(prog, gl_runtime, shape, x)


def test_elementwise_root_reads_each_texel_once(dialect: str) -> None:
    """tanh(x * w + b) over (8, 12): one kernel, three stored operands (x, w and the bias), one
    texel read each per fragment (the per-component roots read twelve); the root is called once."""
    model = Fn(lambda x, m: (x * m.r + m.b).tanh(), 8, 12)
    prog = glcomp.compile(model, {"x": (8, 12)}, target=dialect)
    (source,) = fragment_shaders(prog)
    assert texel_reads(source) == 3
    assert source.count("glc_root0_4(") == 2  # defined once, called once
    assert source.count("glc_pick(") == 2  # one component select: the row's weight, splatted


def test_values_read_twice_are_computed_once(dialect: str, gl_runtime: Any) -> None:
    """x * x + x reads x's texel once: a fused DAG is emitted as straight-line code, one local
    per node, not as nested calls that the shader compiler inlines into a tree (three reads)."""
    model = Fn(lambda x, m: x * x + x, 4, 8)
    (source,) = fragment_shaders(glcomp.compile(model, {"x": (4, 8)}, target=dialect))
    assert texel_reads(source) == 1
    prog = glcomp.compile(model, {"x": (4, 8)}, loss=SumLoss(), target=dialect)
    x = np.random.default_rng(5).normal(size=(4, 8)).astype(np.float32)
    check(prog, gl_runtime, (4, 8), x)


def test_render_targets_of_one_geometry_share_their_values(dialect: str, gl_runtime: Any) -> None:
    """Two outputs of one shape from one draw, both from t = tanh(x * s): main() computes t once
    for both (x, s and the bias read once each: 3 texel reads; one chain per target read 5)."""

    def two(x: Any, m: Any) -> Any:
        t = (x * m.s).tanh()
        return t, t * 2.0 + m.b

    prog = glcomp.compile(Fn(two, 4, 8), {"x": (4, 8)}, target=dialect)
    (source,) = fragment_shaders(prog)
    assert texel_reads(source) == 3
    assert "glc_root" not in source
    x = np.random.default_rng(6).normal(size=(4, 8)).astype(np.float32)
    want = evaluate(prog.graphs["predict"], {"x": x, **{k: np.asarray(v) for k, v in prog.state().items()}})
    with gl_runtime(prog) as gl:
        got = gl.run("predict", {"x": x})
    assert sorted(got) == sorted(want) and len(want) == 2
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=RTOL, atol=ATOL, err_msg=key)


def test_matmul_reads_fused_operands_texel_wise(dialect: str, gl_runtime: Any) -> None:
    """Tanh, Linear, Tanh, Linear: the first product's A is fused (tanh of the input, stored
    nowhere), read a texel along K per step of its loop rather than four scalar calls."""
    glcomp.manual_seed(2)
    model = nn.Sequential(nn.Tanh(), nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 5))
    prog = glcomp.compile(model, {"x": (7, 6)}, loss=SumLoss(), optimizer=optim.SGD(lr=0.1), target=dialect)
    sources = fragment_shaders(prog)
    assert any(re.search(r"vec4 a = v\d+_4\(i0, 4 \* kk\);", s) for s in sources)
    assert not any("vec4 a = vec4(v" in s for s in sources)
    x = np.random.default_rng(3).normal(size=(7, 6)).astype(np.float32)
    check(prog, gl_runtime, (7, 5), x)


@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduction_reads_fused_input_texel_wise(op: str, dialect: str, gl_runtime: Any) -> None:
    """A sum or max over the batch of a fused expression (a bias gradient): one texel of the
    expression per step; all values negative, so padding let into a max would show."""
    prog = glcomp.compile(
        Fn(lambda x, m: prim(op, (x * m.s - 5.0).tanh() * 3.0, axes=(0, 1)), 3, 2),
        {"x": (4, 3, 7)},
        target=dialect,
        max_loop_iterations=5,
    )
    assert any(re.search(r"vec4 t4 = v\d+_4\(", s) for s in fragment_shaders(prog))
    x = np.random.default_rng(4).normal(size=(4, 3, 7)).astype(np.float32)
    with gl_runtime(prog) as gl:
        want = prog.runtime("reference").predict(x=x)
        np.testing.assert_allclose(gl.predict(x=x), want, rtol=RTOL, atol=ATOL)


class Views(nn.Module):
    """Views between elementwise ops: texel-preserving ones pass texels, others are gathered."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.w = nn.Parameter(np.random.default_rng(5).normal(size=(3, 2, 8)).astype(np.float32))

    def forward(self, x: Any) -> Any:  # x: (2, 3, 8)
        if self.form == "permute_lead":  # leading axes swapped, rows kept
            return (x.permute(1, 0, 2) * self.w).tanh()
        if self.form == "reshape_rows":  # the same rows of 8 in another shape
            return (x.reshape(6, 8) * self.w.reshape(6, 8)).exp()
        if self.form == "slice_aligned":  # columns 4..8 of every row: whole texels
            return x[:, :, 4:8] * self.w[:, :, 0:4].permute(1, 0, 2)
        if self.form == "slice_unaligned":  # columns 1..7: gathered per component
            return x[:, :, 1:7] * 2.0 + self.w.permute(1, 0, 2)[:, :, 2:8]
        if self.form == "transpose_last":  # the last axis moves: gathered
            return x.permute(0, 2, 1) * self.w.permute(1, 2, 0)
        if self.form == "pad_aligned":  # zeros before (4) and after (2) the rows, and whole rows
            return (prim("pad", x, before=(0, 1, 4), after=(1, 0, 2)) - 1.0).exp()
        if self.form == "pad_aligned_ragged":  # rows of 6 after 4 zeros: lanes past 10 are zero
            return (prim("pad", x[:, :, 0:6], before=(0, 0, 4), after=(1, 0, 1)) - 1.0).exp()
        if self.form == "pad_unaligned":  # 3 zeros before each row: gathered
            return (prim("pad", x, before=(0, 0, 3), after=(0, 0, 0)) - 1.0).exp()
        if self.form == "concat_lead":  # rows stacked along a leading axis: whole texels
            return (glcomp.cat([x.permute(1, 0, 2), self.w * 2.0, x.permute(1, 0, 2)], dim=1) + 1.0).tanh()
        if self.form == "concat_last_aligned":  # rows of 8 and 4 joined: each texel in one operand
            return (glcomp.cat([x, self.w[:, :, 0:4].permute(1, 0, 2)], dim=2) * 0.5).exp()
        if self.form == "concat_last_unaligned":  # rows of 6 and 2 joined: gathered
            return (glcomp.cat([x[:, :, 0:6], x[:, :, 6:8] * 3.0], dim=2) - 1.0).exp()
        return (x.reshape(2, 24) * 3.0).sigmoid()  # rows of 24: gathered


# Texture reads per fragment: one per stored operand where the view keeps texels whole, four
# (a gather) where it does not.
VIEW_READS = {
    "permute_lead": 2,
    "reshape_rows": 2,
    "slice_aligned": 2,
    "slice_unaligned": 8,
    "transpose_last": 8,
    "regroup": 4,
    "pad_aligned": 1,
    "pad_aligned_ragged": 1,
    "pad_unaligned": 4,
    # a branch per operand: every operand's texel read is counted, one runs
    "concat_lead": 3,
    "concat_last_aligned": 2,
    "concat_last_unaligned": 8,
}


@pytest.mark.parametrize("form", sorted(VIEW_READS))
def test_views_inside_vec4_chains(form: str, dialect: str, gl_runtime: Any):
    prog = glcomp.compile(Views(form), {"x": (2, 3, 8)}, target=dialect)
    assert [texel_reads(s) for s in fragment_shaders(prog)] == [VIEW_READS[form]]
    # bounds tests without `&&` (a branch for the shader translator): all(bvecN(...))
    assert "&&" not in fragment_shaders(prog)[0].split("void main()")[0].split("glc_texel(sampler2D")[1]
    x = np.random.default_rng(7).normal(size=(2, 3, 8)).astype(np.float32)
    with gl_runtime(prog) as gl:
        want = prog.runtime("reference").predict(x=x)
        np.testing.assert_allclose(gl.predict(x=x), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("storage", ["f32", "rgba8"])
@pytest.mark.parametrize("shape", [(7, 5), (8, 12)])
def test_transposed_operands_read_a_texel_per_row(
    shape: tuple[int, int], storage: str, dialect: str, gl_runtime: Any
) -> None:
    """tanh(2 x^T): each output texel holds one column of x across four rows, read as those rows'
    four texels and one component select for all four (not four scalar fetches and selects);
    rows past x's last (7 is not a multiple of 4) are clamped reads whose lanes main() drops."""
    prog = glcomp.compile(
        Fn(lambda x, m: (x.t() * 2.0).tanh(), *shape), {"x": shape}, target=dialect, storage=storage
    )
    (source,) = fragment_shaders(prog)
    assert storage == "rgba8" or texel_reads(source) == 4  # rgba8: a texel is 4 GL texels
    assert "glc_fetcht_" in source and "glc_pick(v, " not in source  # no scalar fetch's component select
    x = np.random.default_rng(8).normal(size=shape).astype(np.float32)
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(gl.predict(x=x), np.tanh(2.0 * x.T), rtol=RTOL, atol=ATOL)


def test_nan_and_inf_propagate_through_vec4_chains(
    dialect: str, gl_runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NaN and inf inputs (the feed check bypassed, as a diverged model would hold them): relu,
    maximum, tanh and where keep NaN where the reference has it, masks are exact."""
    monkeypatch.setattr(
        gl_module, "check_feeds", lambda entry, specs, given: {k: np.asarray(v) for k, v in given.items()}
    )
    x = np.arange(24, dtype=np.float32).reshape(4, 6) - 9.0
    x[0, 1] = x[2, 3] = np.nan
    x[3, 0], x[1, 5] = np.inf, -np.inf

    def fn(t: Any, m: Any) -> Any:
        return (
            F.relu(t).maximum(t * 0.5) * 2.0
            + t.tanh()
            + glcomp.where(t > 0, t, -t - 1.0)
            + (t == t) * 10.0
            + (t < m.b) * 100.0
        )

    model = Fn(fn, 4, 6)
    prog = glcomp.compile(model, {"x": (4, 6)}, target=dialect)
    feeds = {"x": x, **{k: np.asarray(v) for k, v in model.state_dict().items()}}
    with np.errstate(invalid="ignore", over="ignore"):
        want = evaluate(prog.graphs["predict"], feeds)["output"]
    assert np.isnan(want).any() and np.isinf(want).any()
    with gl_runtime(prog) as gl:
        got = gl.predict(x=x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("n", [37, 64])
def test_hash_uniform_vec4_is_bit_exact(n: int, dialect: str, gl_runtime: Any) -> None:
    class Hash(nn.Module):
        def forward(self, x: Any) -> Any:
            return prim("hash_uniform", x * 3.0 + 1.0, x * 0.0 + 12345.0) * 2.0 - x

    prog = glcomp.compile(Hash(), {"x": (n,)}, target=dialect)
    assert any("glc_uniform(a.w, b.w, j0 + 3)" in s for s in fragment_shaders(prog))
    x = np.floor(np.random.default_rng(n).uniform(-50, 50, size=n)).astype(np.float32)
    with gl_runtime(prog) as gl:
        np.testing.assert_array_equal(gl.predict(x=x), prog.runtime("reference").predict(x=x))


def test_dropout_masks_are_bit_exact(dialect: str, gl_runtime: Any) -> None:
    """The same elements dropped on both runtimes, step after step (x * mask * 2 is exact)."""

    class Drop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(np.ones((5, 7), np.float32))

        def forward(self, x: Any) -> Any:
            return F.dropout(x * self.w, 0.5)

    glcomp.manual_seed(4)
    prog = glcomp.compile(Drop(), {"x": (5, 7)}, loss=SumLoss(), optimizer=optim.SGD(lr=0.5), target=dialect)
    rng = np.random.default_rng(9)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        for _ in range(3):
            x = rng.normal(size=(5, 7)).astype(np.float32)
            y = rng.normal(size=(5, 7)).astype(np.float32)
            np.testing.assert_array_equal(gl.predict(x=x), ref.predict(x=x))
            loss = ref.train_step(x=x, y=y)
            np.testing.assert_allclose(gl.train_step(x=x, y=y), loss, rtol=RTOL, atol=ATOL)
        np.testing.assert_array_equal(gl.state_dict()["w"], ref.state_dict()["w"])


def test_adam_multi_target_kernels_match_reference(dialect: str, gl_runtime: Any) -> None:
    """Adam writes the weight and both moments from one draw: three vec4 roots in one shader. The
    loss gradient's one-hot rows are built a texel at a time."""
    glcomp.manual_seed(6)
    model = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 3))
    prog = glcomp.compile(
        model, {"x": (4, 6)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=0.01), target=dialect
    )
    sources = fragment_shaders(prog)
    # the weight and both moments computed together in main(): each texture read once
    mrt = [s for s in sources if "glc_out2 =" in s or "gl_FragData[2]" in s]
    assert any("glc_root" not in s and texel_reads(s) == s.count("uniform sampler2D") == 6 for s in mrt)
    assert any("int k = int(floor(" in s for s in sources)  # one_hot: the row's label read once
    rng = np.random.default_rng(2)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        for _ in range(3):
            x = rng.normal(size=(4, 6)).astype(np.float32)
            y = rng.integers(0, 3, size=4)
            loss = ref.train_step(x=x, y=y)
            np.testing.assert_allclose(gl.train_step(x=x, y=y), loss, rtol=1e-4, atol=1e-5)
        want = ref.state_dict()
        for name, value in gl.state_dict().items():
            np.testing.assert_allclose(value, want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_vec4_chains_read_textures_split_into_pages(dialect: str, gl_runtime: Any) -> None:
    """Textures of at most 4 x 4 texels: the operands span several pages, read a texel at a time."""
    model = Fn(CHAINS["broadcast"], 6, 13)
    prog = glcomp.compile(model, {"x": (6, 13)}, loss=SumLoss(), target=dialect, max_texture_size=4)
    assert any("int p = t / 16;" in s and "_4(int row, int j0)" in s for s in fragment_shaders(prog))
    x = np.random.default_rng(8).normal(size=(6, 13)).astype(np.float32)
    check(prog, gl_runtime, (6, 13), x)
