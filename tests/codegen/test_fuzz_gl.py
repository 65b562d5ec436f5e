"""Differential fuzzing of code generation: random small CNNs and MLPs under random pass settings
and both dialects must compute on the GL runtime what the numpy reference computes.

Hypothesis draws a model (conv / pool / activation / linear stacks, inputs up to 32x32, random
strides and paddings, a few channels), a batch, an optimizer (SGD with momentum, or Adam) and a
setting of every code-generation pass, then checks `gradients` and three `train_step`s. Each step
starts both runtimes from the same state (the GL state is copied into the reference after every
step), so a step's error never feeds the next and tolerances stay tight.

The example count comes from the Hypothesis profile: "default" (a few examples, fixed seed) or
`pytest --slow` (thousands, random seed). Also pins the regressions the fuzzer found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import hypothesis
import numpy as np
import pytest
from hypothesis import given, note, target
from hypothesis import strategies as st

import glcomp
from glcomp import nn, optim
from glcomp.codegen import cost
from glcomp.codegen.bundle import PASSES, build_bundle
from glcomp.codegen.kernels import Kernel
from glcomp.codegen.layout import layout_for
from glcomp.codegen.passes import tiling
from glcomp.codegen.passes.mrt import mrt_fusion
from glcomp.codegen.target import make_target

RTOL = 1e-4  # relative to each element
ATOL = 1e-5  # relative to the largest magnitude of the tensor compared
ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "leaky": lambda: nn.LeakyReLU(0.1)}


@dataclass
class Spec:
    """A drawn model and its compile settings; `repr` is what a failing example prints."""

    batch: int
    channels: int
    height: int
    width: int
    layers: list[tuple[Any, ...]] = field(default_factory=list)
    classes: int = 3
    optimizer: str = "sgd"
    target: str = "webgl2"
    passes: dict[str, bool] = field(default_factory=dict)
    seed: int = 0
    split_steps: int | None = None  # split K from this many steps of 4 (glcomp.codegen.families.matmul)
    # tile every product the fetch count favours (no fixed cost of blocked draws): small models
    # then run register-blocked products, read from their tiles by their epilogues
    force_tiles: bool = False

    def longest_loop(self) -> int:
        """The most positions a conv layer's weight gradient sums over (batch x output area)."""
        h, w, most = self.height, self.width, 0
        for layer in self.layers:
            if layer[0] == "conv":
                _, _, _, k, stride, pad, _ = layer
                h, w = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
                most = max(most, self.batch * h * w)
            elif layer[0] in ("maxpool", "avgpool"):
                h, w = h // layer[1], w // layer[1]
        return most

    def build(self) -> nn.Module:
        mods: list[nn.Module] = []
        for layer in self.layers:
            kind = layer[0]
            if kind == "conv":
                _, cin, cout, k, stride, pad, bias = layer
                mods.append(nn.Conv2d(cin, cout, k, stride=stride, padding=pad, bias=bias))
            elif kind == "maxpool":
                mods.append(nn.MaxPool2d(layer[1]))
            elif kind == "avgpool":
                mods.append(nn.AvgPool2d(layer[1]))
            elif kind == "flatten":
                mods.append(nn.Flatten())
            elif kind == "linear":
                mods.append(nn.Linear(layer[1], layer[2], bias=layer[3]))
            else:
                mods.append(ACTIVATIONS[kind]())
        return nn.Sequential(*mods)

    def make_optimizer(self) -> optim.Optimizer:
        if self.optimizer == "adam":
            return optim.Adam(lr=1e-3)
        return optim.SGD(lr=0.05, momentum=0.9)


@st.composite
def specs(draw: Any) -> Spec:
    """Models whose every shape is valid: conv blocks while the image is large enough, then
    Flatten and one to three Linear layers."""
    # Small and large models alike: long loops (a batch of 16 at 32x32 through a conv layer) are
    # where kernels meet the limits of the target and of software rasterizers.
    if draw(st.booleans()):
        batch, size, convs = st.sampled_from([8, 12, 16]), st.integers(24, 32), st.integers(1, 2)
    else:
        batch, size, convs = st.integers(1, 4), st.integers(1, 12), st.integers(0, 2)
    spec = Spec(batch=draw(batch), channels=draw(st.integers(1, 3)), height=draw(size), width=draw(size))
    c, h, w = spec.channels, spec.height, spec.width
    for _ in range(draw(convs)):
        k = draw(st.integers(1, min(5, h + 2, w + 2)))
        pad = draw(st.integers(0, min(2, k - 1)))
        stride = draw(st.sampled_from([1, 1, 2]))
        oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        if oh < 1 or ow < 1:
            break
        cout = draw(st.integers(1, 4))
        spec.layers.append(("conv", c, cout, k, stride, pad, draw(st.booleans())))
        c, h, w = cout, oh, ow
        act = draw(st.sampled_from([None, *ACTIVATIONS]))
        if act:
            spec.layers.append((act,))
        pool = draw(st.sampled_from([None, "maxpool", "avgpool"]))
        if pool and h >= 2 and w >= 2:
            spec.layers.append((pool, 2))
            h, w = h // 2, w // 2
    spec.layers.append(("flatten",))
    features = c * h * w
    spec.classes = draw(st.integers(2, 5))
    for _ in range(draw(st.integers(0, 2))):
        out = draw(st.integers(2, 16))
        spec.layers.append(("linear", features, out, draw(st.booleans())))
        spec.layers.append((draw(st.sampled_from(sorted(ACTIVATIONS))),))
        features = out
    spec.layers.append(("linear", features, spec.classes, True))
    spec.optimizer = draw(st.sampled_from(["sgd", "adam"]))
    spec.target = draw(st.sampled_from(["webgl2", "webgl1", "webgl2-gpu"]))
    spec.passes = {name: draw(st.booleans()) for name in sorted(PASSES)}
    spec.seed = draw(st.integers(0, 2**16))
    # Small models split K only with a low threshold (the default needs 1024-long products).
    spec.split_steps = draw(st.sampled_from([None, 2, 4]))
    spec.force_tiles = draw(st.booleans())
    return spec


def assert_close(got: np.ndarray, want: np.ndarray, what: str, scale: float | None = None) -> None:
    """Elementwise |got - want| <= RTOL |want| + ATOL scale, `scale` being the magnitude the
    values are sums of (by default the largest of `want`): a gradient of 1e-3 is compared at
    1e-8, not at an absolute 1e-5, and a gradient that cancels to nearly nothing is compared at
    the rounding of the terms it sums."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if scale is None:
        scale = float(np.abs(want).max()) if want.size else 0.0
    err = np.abs(got - want)
    bad = err > RTOL * np.abs(want) + ATOL * scale + 1e-30
    assert not bad.any(), (
        f"{what}: {int(bad.sum())}/{bad.size} elements differ, max error {err.max():.3g} "
        f"(scale {scale:.3g}, {err.max() / max(scale, 1e-30):.2%} of it)"
    )


def _slot(name: str) -> str:
    """The optimizer-state slot of a state name (`opt.0.weight.exp_avg` -> `exp_avg`)."""
    return name.rsplit(".", 1)[-1]


def check_model(spec: Spec, gl_runtime: Any) -> None:
    """GL == reference for `gradients` and three `train_step`s of `spec` (each step from equal states)."""
    default, blocked, gather = tiling.LONG_STEPS, cost.BLOCKED_DRAW, cost.GATHER_FETCHES
    tiling.LONG_STEPS = spec.split_steps or default
    if spec.force_tiles:
        cost.BLOCKED_DRAW, cost.GATHER_FETCHES = 0, 0
    try:
        _check_model(spec, gl_runtime)
    finally:
        tiling.LONG_STEPS, cost.BLOCKED_DRAW, cost.GATHER_FETCHES = default, blocked, gather


def _check_model(spec: Spec, gl_runtime: Any) -> None:
    glcomp.manual_seed(spec.seed)
    model = spec.build()
    prog = glcomp.compile(
        model,
        {"x": (spec.batch, spec.channels, spec.height, spec.width)},
        loss=nn.CrossEntropyLoss(),
        optimizer=spec.make_optimizer(),
        target=spec.target,
        passes=spec.passes,
    )
    rng = np.random.default_rng(spec.seed)
    x = rng.normal(size=(spec.batch, spec.channels, spec.height, spec.width)).astype(np.float32)
    y = rng.integers(0, spec.classes, size=spec.batch)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        want, got = ref.gradients(x=x, y=y), gl.gradients(x=x, y=y)
        assert sorted(got) == sorted(want)
        scale = max(float(np.abs(v).max()) for v in want.values())  # the model's gradient magnitude
        for name in want:
            assert_close(got[name], want[name], f"gradient of {name}", scale)
        for step in range(3):
            ref_loss, gl_loss = ref.train_step(x=x, y=y), gl.train_step(x=x, y=y)
            # A cross-entropy near zero is the log-sum-exp minus the target's logit, both of order
            # one or more: its rounding is float32's relative to those, not to the loss (a loss of
            # 0.001 differed by 1.2e-7, one ulp of 1.0, on an all-passes-off model).
            loss_scale = max(abs(float(ref_loss)), 1.0)
            assert_close(np.float64(gl_loss), np.float64(ref_loss), f"step {step} loss", loss_scale)
            state, opt_state = gl.state_dict(), gl.optimizer_state()
            for name, value in ref.params.items():
                # Adam divides by sqrt(v) + eps: a gradient at rounding-noise level moves a weight
                # by up to a fraction of lr on either runtime, so weights get lr-sized slack.
                slack = 0.05 * 1e-3 if spec.optimizer == "adam" else 0.0
                diff = np.abs(state[name] - value).max()
                assert diff <= RTOL * np.abs(value).max() + slack + 1e-7, f"step {step} {name}: {diff:.3g}"
            slots: dict[str, float] = {}
            for name, value in ref.opt_state.items():
                slots[_slot(name)] = max(slots.get(_slot(name), 0.0), float(np.abs(value).max()))
            for name, value in ref.opt_state.items():
                assert_close(opt_state[name], value, f"step {step} {name}", slots[_slot(name)])
            # Continue both runtimes from the GL state.
            ref.params = {k: np.array(state[k], ref.dtype) for k in ref.params}
            ref.opt_state = {k: np.array(opt_state[k], ref.dtype) for k in ref.opt_state}


def test_gl_matches_reference_on_random_models(gl_runtime: Any, request: pytest.FixtureRequest) -> None:
    """The differential fuzzer (example count from the Hypothesis profile; `--slow` for thousands)."""

    @given(spec=specs())
    def run(spec: Spec) -> None:
        note(repr(spec))
        # Steer the search toward long loops, where shaders meet the loop limits of the target
        # and of software rasterizers (Hypothesis's targeted phase maximises this).
        target(float(spec.longest_loop()), label="longest conv-gradient loop")
        check_model(spec, gl_runtime)

    if not request.config.getoption("--slow"):
        run = hypothesis.seed(20261130)(run)  # the quick run is reproducible
    run()


# -- regressions the fuzzer pins ---------------------------------------------------------------------
LENET = [
    ("conv", 1, 6, 5, 1, 0, True),
    ("relu",),
    ("maxpool", 2),
    ("conv", 6, 16, 5, 1, 0, True),
    ("relu",),
    ("maxpool", 2),
    ("flatten",),
    ("linear", 400, 120, True),
    ("relu",),
    ("linear", 120, 84, True),
    ("relu",),
    ("linear", 84, 10, True),
]


def test_lenet_32x32_adam_first_conv_gradient(gl_runtime: Any) -> None:
    """LeNet-5 on 32x32 inputs, batch 16, Adam: MRT put the first conv layer's bias gradient (a
    sum over 16x28x28) and weight gradient (a loop over 16x28x28) in one draw, past the loop
    limit llvmpipe shares between all loops of a shader invocation; the weight gradient in
    Adam's moments came out 16% off."""
    spec = Spec(16, 1, 32, 32, LENET, classes=10, optimizer="adam", seed=0)
    check_model(spec, gl_runtime)


def test_single_kernel_past_the_loop_budget_is_unrolled(gl_runtime: Any) -> None:
    """A conv weight gradient over 32x30x30 positions runs 4 x 28800 iterations per texel: alone
    past the budget, its loop body is repeated so the shader stays within it (it gave partial
    sums before, with every pass off)."""
    spec = Spec(32, 1, 32, 32, [("conv", 1, 2, 3, 1, 0, False), ("flatten",), ("linear", 1800, 2, True)])
    spec.classes, spec.passes = 2, {"mrt": False, "epilogue": False}
    check_model(spec, gl_runtime)


def test_mrt_refuses_groups_past_the_loop_budget() -> None:
    """Two loop kernels that fit the budget alone but not together stay in separate draws."""
    from glcomp.codegen.loops import FRAGMENT_LOOP_BUDGET, fragment_iterations

    glcomp.manual_seed(0)
    spec = Spec(16, 1, 32, 32, LENET, classes=10, optimizer="adam")
    prog = glcomp.compile(
        spec.build(), {"x": (16, 1, 32, 32)}, loss=nn.CrossEntropyLoss(), optimizer=spec.make_optimizer()
    )
    bundle = build_bundle(prog)
    assert any("+" in d["kernel"] for d in bundle.manifest["entries"]["train_step"]["draws"])  # MRT is on
    graph = prog.graphs["train_step"]
    webgl2 = make_target("webgl2")
    weight_grads = [n for n in graph.nodes() if graph.op(n) == "conv2d_weight_grad"]
    first = max(weight_grads, key=lambda n: graph.shape(graph.operands(n)[1])[2])  # 28x28 gradient
    x, g = graph.operands(first)
    sums = [n for n in graph.nodes() if graph.op(n) == "sum" and list(graph.operands(n)) == [g]]
    assert sums, "the first conv layer's bias gradient reads its output gradient directly"
    kernels = [Kernel("k0_sum", [sums[0]], [], [g], "reduce"), Kernel("k1_wg", [first], [], [x, g], "conv")]
    alone = [fragment_iterations(graph, k.roots, set(k.leaves), webgl2.max_loop_iterations) for k in kernels]
    assert all(n <= FRAGMENT_LOOP_BUDGET for n in alone) and sum(alone) > FRAGMENT_LOOP_BUDGET
    layouts = {n: layout_for(graph.shape(n), webgl2.max_texture_size) for n in graph.nodes()}
    merged, _ = mrt_fusion(kernels, graph, layouts, webgl2, fixed=set())
    assert len(merged) == 2


def test_kernel_past_the_budget_even_unrolled_is_refused() -> None:
    """A loop too long to fit the per-invocation budget even unrolled is a compile error naming
    the layer, not a shader that silently returns partial sums."""
    glcomp.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 1, 3), nn.Flatten(), nn.Linear(598 * 598, 2))
    loss, opt = nn.CrossEntropyLoss(), optim.SGD(lr=0.1)
    prog = glcomp.compile(model, {"x": (1, 1, 600, 600)}, loss=loss, optimizer=opt)
    with pytest.raises(glcomp.GlcompError, match=r"loop iterations per texel.*smaller batch"):
        build_bundle(prog)
