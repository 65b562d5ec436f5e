"""Recurrences and concatenations of any length compile and train within the target's texture units.

An unrolled LSTM stacks one output per time step and sums one weight-gradient term per step; a
kernel may sample only `max_texture_units` texture pages (16 on portable WebGL 2). Wide concats
become trees of gathers (glcomp/codegen/passes/split_wide.py) and long fused sums are cut into
kernels that each fit (glcomp/codegen/passes/texture_units.py); these tests check both against the
numpy reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim
from glcomp.codegen.bundle import Bundle, build_bundle
from glcomp.codegen.layout import layout_for
from glcomp.codegen.passes.split_wide import split_wide_graph
from glcomp.codegen.target import make_target
from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph
from glcomp.ir.interpret import evaluate

RTOL, ATOL = 1e-4, 1e-5


class SeqModel(nn.Module):
    """LSTM(batch_first) whose every step's output is read (mean over time) plus the last one."""

    def __init__(self, hidden: int = 3) -> None:
        super().__init__()
        self.lstm = nn.LSTM(2, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 2)

    def forward(self, x: Any) -> Any:
        out, _ = self.lstm(x)
        return self.head(out.mean(1) + out[:, -1])


class WideCat(nn.Module):
    """`glcomp.cat` of `parts` stored tensors (each also read by a running sum), then Linear."""

    def __init__(self, parts: int) -> None:
        super().__init__()
        self.parts = parts
        self.scale = nn.Parameter(np.linspace(0.5, 1.5, parts * 3, dtype=np.float32).reshape(parts, 3))
        self.head = nn.Linear(parts * 3, 2)

    def forward(self, x: Any) -> Any:
        pieces = [(x[:, i] * self.scale[i]).tanh() for i in range(self.parts)]
        total = pieces[0]
        for p in pieces[1:]:
            total = total + p
        return self.head(glcomp.cat(pieces, 1)) + total.sum(1, keepdim=True)


def _compile(model: nn.Module, shape: tuple[int, ...], target: str, **limits: Any) -> glcomp.Program:
    return glcomp.compile(
        model,
        inputs={"x": shape},
        loss=nn.CrossEntropyLoss(),
        optimizer=optim.Adam(lr=1e-2),
        target=target,
        **limits,
    )


def _check_training(gl_runtime: Any, prog: glcomp.Program, shape: tuple[int, ...], steps: int) -> None:
    """GL gradients and `steps` train-step losses equal the reference runtime's."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype(np.float32)
    y = rng.integers(0, 2, size=shape[:1])
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        want, got = ref.gradients(x=x, y=y), gl.gradients(x=x, y=y)
        assert sorted(got) == sorted(want)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)
        losses = [(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y)) for _ in range(steps)]
        np.testing.assert_allclose(*zip(*losses, strict=True), rtol=RTOL, atol=ATOL)
        assert losses[-1][0] < losses[0][0]  # it trains
        for name, value in ref.state_dict().items():
            np.testing.assert_allclose(gl.state_dict()[name], value, rtol=RTOL, atol=ATOL, err_msg=name)


def _max_reads(bundle: Bundle) -> int:
    return max(len(d["samplers"]) for e in bundle.manifest["entries"].values() for d in e["draws"])


# GLSL ES 1.00 beyond 16 steps (the texture-unit limit) is checked on 17 steps below; 100 steps
# of it with `--slow`.
@pytest.mark.parametrize("target", ["webgl2", pytest.param("webgl1", marks=pytest.mark.slow_only)])
def test_lstm_over_100_steps_trains_on_gl(gl_runtime: Any, target: str) -> None:
    glcomp.manual_seed(1)
    prog = _compile(SeqModel(), (2, 100, 2), target)
    bundle = build_bundle(prog)
    assert _max_reads(bundle) <= 16
    # Every step's kernels share programs (the 100 steps would otherwise compile ~1000 shaders).
    assert len(bundle.manifest["programs"]) < 100
    _check_training(gl_runtime, prog, (2, 100, 2), steps=2)


@pytest.mark.parametrize("target", ["webgl2", "webgl1"])
def test_lstm_over_17_steps_trains_in_both_dialects(gl_runtime: Any, target: str) -> None:
    glcomp.manual_seed(2)
    prog = _compile(SeqModel(), (3, 17, 2), target)
    _check_training(gl_runtime, prog, (3, 17, 2), steps=3)


@pytest.mark.parametrize("units", [4, 8])
def test_small_texture_unit_targets(gl_runtime: Any, units: int) -> None:
    glcomp.manual_seed(3)
    shape = (2, units + 1, 2)  # one step more than units: the stacked outputs cannot fit one kernel
    prog = _compile(SeqModel(), shape, "webgl1", max_texture_units=units)
    assert _max_reads(build_bundle(prog)) <= units
    _check_training(gl_runtime, prog, shape, steps=2)


def test_cat_of_40_tensors_forward_and_backward(gl_runtime: Any) -> None:
    glcomp.manual_seed(4)
    prog = _compile(WideCat(40), (2, 40, 3), "webgl2")
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 40, 3)).astype(np.float32)
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(
            gl.predict(x=x), prog.runtime("reference").predict(x=x), rtol=RTOL, atol=ATOL
        )
    _check_training(gl_runtime, prog, (2, 40, 3), steps=2)


def test_long_sums_are_cut_every_limit_minus_one_terms() -> None:
    """A sum of 40 stored terms needs 3 kernels of at most 16 samplers, not one per term."""
    glcomp.manual_seed(4)
    bundle = build_bundle(_compile(WideCat(40), (2, 40, 3), "webgl2", passes={"mrt": False}))
    draws = bundle.manifest["entries"]["predict"]["draws"]
    sums = [d for d in draws if d["kernel"].endswith("_add")]
    assert _max_reads(bundle) <= 16
    assert len(sums) <= 4, [d["kernel"] for d in sums]


def _wide_concat_graph(parts: int, shape: tuple[int, ...]) -> Graph:
    g = Graph()
    xs = [g.add_input(f"x{i}", shape, "data") for i in range(parts)]
    cat = g.add("concat", xs, axis=0)
    g.outputs["y"] = g.add("tanh", [cat])
    g.outputs["last"] = g.add("slice", [cat], starts=(shape[0] * (parts - 1), 0), stops=(shape[0] * parts, 2))
    return g


@pytest.mark.parametrize(("units", "size"), [(16, 4096), (4, 4096), (4, 8), (2, 4096)])
def test_split_wide_keeps_every_node_within_the_limit(units: int, size: int) -> None:
    """Every node reads at most `units` pages (multi-page operands counted) and values are unchanged."""
    graph = _wide_concat_graph(37, (3, 5))
    out = split_wide_graph(graph, make_target("webgl2", max_texture_units=units, max_texture_size=size))
    out.validate()
    for n in out.nodes():
        reads = sum(layout_for(out.shape(o), size).pages for o in set(out.operands(n)))
        assert reads <= units, (n, out.op(n), reads)
    # out[-1] of the concat reads only the last operand.
    assert out.op(out.outputs["last"]) != "concat" and len(out.operands(out.outputs["last"])) <= 1
    rng = np.random.default_rng(0)
    feeds = {f"x{i}": rng.normal(size=(3, 5)).astype(np.float32) for i in range(37)}
    want, got = evaluate(graph, feeds), evaluate(out, feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_tensor_with_more_pages_than_units_is_a_clear_error() -> None:
    """Only a single tensor split into more pages than the target has units cannot be helped."""
    prog = glcomp.compile(nn.Tanh(), {"x": (64, 4)}, max_texture_size=2, max_texture_units=2)
    with pytest.raises(GlcompError, match=r"texture pages.*raise max_texture_size"):
        build_bundle(prog)
