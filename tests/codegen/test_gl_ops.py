"""Every registered op, run through the GL code generator and runtime, against the numpy reference.

Each example builds a tiny model whose parameters hold the op's operands (drawn by the op's own
`sample` hook, inside its domain) and whose forward applies the op, sometimes multiplied by the
data input so that the op is fused into a reader instead of rooting a kernel. The model is
compiled for both GLSL dialects; `predict` and `gradients` of the GL runtime must match the
reference runtime. The loss is ``sum(output * y)`` with a random target `y`, so every output
element reaches each gradient with a different weight.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from typing import Any

import hypothesis
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import glcomp
from glcomp import nn, optim
from glcomp.codegen.bundle import build_bundle
from glcomp.codegen.layout import layout_for
from glcomp.errors import GlcompError
from glcomp.ir.ops import REGISTRY, get_op
from glcomp.ir.tensor import prim
from glcomp.testing import OpCase, op_cases

RTOL, ATOL = 1e-4, 1e-5
# preprocess reads a frame sheet (an image input's own texture layout), not a tensor that a model
# part computes or pages: tests/transforms/test_preprocess.py runs it on GL in both dialects.
FRAME_OPS = {"preprocess"}
OPS = sorted(name for name, op in REGISTRY.items() if op.kind != "source" and name not in FRAME_OPS)
SHRUNK = {"max_texture_size": 4, "max_loop_iterations": 4}


def examples(count: int, *key: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Hypothesis with `count` examples from a fixed seed per `key` (op, dialect, test): runs are
    reproducible, and each dialect still sees inputs of its own."""

    def apply(test: Callable[..., None]) -> Callable[..., None]:
        configured = settings(
            max_examples=count,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )(test)
        return hypothesis.seed(zlib.crc32("/".join(key).encode()))(configured)

    return apply


class OpModel(nn.Module):
    """forward(x) = op(p0, p1, ...) (times x when `wrap`), the operands being parameters."""

    def __init__(self, case: OpCase, trainable: bool, wrap: bool) -> None:
        super().__init__()
        self.op, self.attrs, self.count, self.wrap = case.op, case.attrs, len(case.inputs), wrap
        for i, value in enumerate(case.inputs):
            setattr(self, f"p{i}", nn.Parameter(value, requires_grad=trainable))

    def forward(self, x: Any) -> Any:
        out = prim(self.op, *(getattr(self, f"p{i}") for i in range(self.count)), **self.attrs)
        return out * x if self.wrap else out


class WeightedSum(nn.Module):
    """Loss ``sum(output * y)``: its gradient with respect to the output is `y` itself."""

    def forward(self, out: Any, y: Any) -> Any:
        return (out * y).sum()

    def target_spec(self, output_shape: tuple[int, ...]) -> dict[str, Any]:
        return {"shape": output_shape, "dtype": "float32"}


@st.composite
def op_examples(draw: Any, op: str) -> tuple[OpCase, bool, int]:
    case = draw(op_cases(op, np.float32))
    if op == "eq":  # distinct values would make eq always 0: share some between the operands
        a, b = case.inputs
        b = b.copy()
        shared = np.zeros(b.size, bool)
        shared[:: draw(st.integers(2, 3))] = True
        b.flat[shared] = a.flat[shared]
        case = OpCase(op, (a, b), case.attrs)
    return case, draw(st.booleans()), draw(st.integers(0, 2**32 - 1))


def compile_case(case: OpCase, wrap: bool, target: str, **limits: Any) -> glcomp.Program:
    rule = get_op(case.op)
    trainable = rule.grad is not None  # ops without a gradient rule get predict only
    out_shape = rule.shape(*case.shapes, **case.attrs)
    model = OpModel(case, trainable, wrap)
    loss = WeightedSum() if trainable else None
    return glcomp.compile(model, inputs={"x": out_shape}, loss=loss, target=target, **limits)


def feeds(prog: glcomp.Program, rng_seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(rng_seed)
    shape = prog.inputs["x"].shape
    return rng.uniform(0.5, 1.5, size=shape).astype(np.float32), rng.normal(size=shape).astype(np.float32)


def assert_gl_matches_reference(prog: glcomp.Program, gl_runtime: Any, rng_seed: int) -> None:
    x, y = feeds(prog, rng_seed)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        got, want = gl.predict(x=x), ref.predict(x=x)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg="predict")
        if "gradients" in prog.graphs:
            got_g, want_g = gl.gradients(x=x, y=y), ref.gradients(x=x, y=y)
            assert sorted(got_g) == sorted(want_g) == sorted(prog.trainable)
            for name in want_g:
                assert got_g[name].shape == want_g[name].shape, name
                np.testing.assert_allclose(got_g[name], want_g[name], rtol=RTOL, atol=ATOL, err_msg=name)


# -- every op, both dialects ----------------------------------------------------------------------
@pytest.mark.parametrize("op", OPS)
def test_op_gl_matches_reference(op: str, dialect: str, gl_runtime: Any):
    @examples(8, op, dialect, "default")
    @given(example=op_examples(op))
    def check(example: tuple[OpCase, bool, int]) -> None:
        case, wrap, rng_seed = example
        assert_gl_matches_reference(compile_case(case, wrap, dialect), gl_runtime, rng_seed)

    check()


def split_limits(case: OpCase) -> dict[str, Any]:
    """Loops of at most 4 iterations, and textures so small that the largest tensor of the case
    spans several pages (up to 4: more would exceed 16 texture units in kernels reading several
    such tensors); only a case whose tensors all fit 4 texels stays on one page."""
    rule = get_op(case.op)
    shapes = [*case.shapes, rule.shape(*case.shapes, **case.attrs)]
    texels = max(layout_for(tuple(s), 1 << 12).texels for s in shapes)
    size = 2
    while 4 * size * size < texels:
        size *= 2
    return {"max_texture_size": size, "max_loop_iterations": 4}


@pytest.mark.parametrize("op", OPS)
def test_op_with_split_textures_and_loops(op: str, dialect: str, gl_runtime: Any):
    """Tensors split into several texture pages and loops split into nested loops."""

    @examples(2, op, dialect, "split")
    @given(example=op_examples(op))
    def check(example: tuple[OpCase, bool, int]) -> None:
        case, wrap, rng_seed = example
        prog = compile_case(case, wrap, dialect, **split_limits(case))
        assert_gl_matches_reference(prog, gl_runtime, rng_seed)

    check()


_UNITS_ERROR = re.compile(
    r"kernel for %(\d+) reads (\d+) texture pages, more than the target's (\d+) texture units"
)
UNITS = 2


def unavoidable(prog: glcomp.Program, err: GlcompError) -> bool:
    """Whether the planner's refusal is justified: the node it names reads, from its own operands
    alone (nothing left to store separately), as many texture pages as the message says, and
    that is more than the target's units."""
    found = _UNITS_ERROR.search(str(err))
    if not found:
        return False
    node, pages, units = (int(v) for v in found.groups())
    size = prog.options.get("max_texture_size", 4096)
    for graph in prog.graphs.values():
        if node in graph.g:
            operands = {o for o in graph.operands(node) if graph.op(o) != "const"}
            if sum(layout_for(graph.shape(o), size).pages for o in operands) == pages > units == UNITS:
                return True
    return False


@pytest.mark.parametrize("op", OPS)
def test_op_with_few_texture_units(op: str, dialect: str, gl_runtime: Any):
    """With 2 texture units the planner stores fused operands until every kernel fits; only an op
    that reads more than 2 textures by itself (concat of 3) is refused, with a clear message."""

    @examples(2, op, dialect, "units")
    @given(example=op_examples(op))
    def check(example: tuple[OpCase, bool, int]) -> None:
        case, wrap, rng_seed = example
        prog = compile_case(case, wrap, dialect, max_texture_units=UNITS)
        try:
            manifest = build_bundle(prog).manifest  # lowering (and planning) happens here
            draws = [d for e in manifest["entries"].values() for d in e["draws"]]
        except GlcompError as err:
            assert unavoidable(prog, err), f"refused without cause: {err}"
            assert "(OpModel)" in str(err)  # names the model part
            return
        assert all(len(d["samplers"]) <= UNITS for d in draws)
        assert_gl_matches_reference(prog, gl_runtime, rng_seed)

    check()


# -- the planner and the split code paths, deterministically ------------------------------------------
class Tree(nn.Module):
    """One fused expression over six textures: a single kernel unless texture units run short."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(5)
        for i in range(5):
            setattr(self, f"p{i}", nn.Parameter(rng.normal(size=(3, 5))))

    def forward(self, x: Any) -> Any:
        return ((self.p0 + self.p1) * (self.p2 - self.p3)).tanh() + self.p4 * x


def _draws(manifest: dict[str, Any], entry: str) -> list[dict[str, Any]]:
    return manifest["entries"][entry]["draws"]


def test_planner_stores_fused_operands_to_fit_texture_units(dialect: str, gl_runtime: Any):
    x = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    y = np.random.default_rng(1).normal(size=(3, 5)).astype(np.float32)
    draws = {}
    for units in (16, 2):
        prog = glcomp.compile(
            Tree(),
            inputs={"x": (3, 5)},
            loss=nn.MSELoss(),
            optimizer=optim.SGD(lr=0.1),
            target=dialect,
            max_texture_units=units,
        )
        ref = prog.runtime("reference")
        with gl_runtime(prog) as gl:
            draws[units] = _draws(gl.manifest, "predict")
            for entry in gl.manifest["entries"]:
                for d in _draws(gl.manifest, entry):
                    assert len(d["samplers"]) <= units, (entry, d["kernel"], sorted(d["samplers"]))
            np.testing.assert_allclose(gl.predict(x=x), ref.predict(x=x), rtol=RTOL, atol=ATOL)
            got, want = gl.gradients(x=x, y=y), ref.gradients(x=x, y=y)
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)
            for _ in range(3):
                np.testing.assert_allclose(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=RTOL)
            got, want = gl.state_dict(), ref.state_dict()
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)
    assert len(draws[16]) == 1, "the whole expression should be one fused kernel"
    assert len(draws[2]) > 1, "with 2 texture units the expression must be split over several kernels"


def test_too_few_texture_units_is_a_clear_error(dialect: str, gl_runtime: Any):
    class Cat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = (nn.Parameter(np.ones((2, 3))) for _ in range(3))

        def forward(self, x: Any) -> Any:
            return glcomp.cat([self.a, self.b, self.c], dim=1) + x

    # A concat of three textures is gathered in two draws on a 2-unit target ...
    prog = glcomp.compile(Cat(), inputs={"x": (2, 9)}, target=dialect, max_texture_units=2)
    x = np.random.default_rng(0).normal(size=(2, 9)).astype(np.float32)
    with gl_runtime(prog) as gl:
        assert all(len(d["samplers"]) <= 2 for d in _draws(gl.manifest, "predict"))
        np.testing.assert_allclose(gl.predict(x=x), prog.runtime("reference").predict(x=x), rtol=RTOL)
    # ... but an add of two tensors of two texture pages each cannot fit two units.
    prog = glcomp.compile(
        Cat(), inputs={"x": (2, 9)}, target=dialect, max_texture_units=2, max_texture_size=2
    )
    with pytest.raises(
        GlcompError, match=r"\(Cat\).*reads 4 texture pages, more than the target's 2 texture units"
    ):
        with gl_runtime(prog):
            pass


def test_split_textures_and_loops_are_exercised(dialect: str, gl_runtime: Any):
    """A matmul over K=22 with 4-iteration loops and 4x4 textures: the output (9x9) spans several
    pages and the loop (K // 4 = 5 steps of 4) is split into nested loops; the results still match."""
    rng = np.random.default_rng(3)
    case = OpCase(
        "matmul",
        (rng.normal(size=(9, 22)).astype(np.float32), rng.normal(size=(22, 9)).astype(np.float32)),
        {},
    )
    prog = compile_case(case, False, dialect, **SHRUNK)
    with gl_runtime(prog) as gl:
        draws = _draws(gl.manifest, "predict")
        assert any(d["page_offset"] > 0 for d in draws), "the output was not split into pages"
        sources = [gl.bundle.shaders[gl.manifest["programs"][d["program"]]["fragment"]] for d in draws]
        assert any(re.search(r"for \(int \w+_o = 0;", s) for s in sources), "the K loop was not split"
        assert all(t["width"] <= 4 and t["height"] <= 4 for t in gl.manifest["textures"].values())
    assert_gl_matches_reference(prog, gl_runtime, 0)
