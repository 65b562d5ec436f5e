"""Numbers and API behaviour that must match torch: Adam's bias corrections on the GPU, max/min
with indices, comparisons as masks, NaN propagation through max-like kernels, refusal of numpy
calls on traced tensors, and a GlcompError naming every mistake in what `compile` and the
runtimes receive.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import glcomp
import glcomp.runtime.gl as gl_module
from glcomp import GlcompError, nn, optim
from glcomp.cli import main
from glcomp.ir.interpret import evaluate
from glcomp.nn import functional as F


class Fn(nn.Module):
    """A model whose forward is one function of its input."""

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: Any) -> Any:
        return self.fn(x)


def predict_graph(fn: Any, x: np.ndarray) -> Any:
    prog = glcomp.compile(Fn(fn), {"x": x.shape})
    with np.errstate(invalid="ignore", over="ignore"):
        out = evaluate(prog.graphs["predict"], {"x": x})
    return out["output"] if list(out) == ["output"] else out


# -- 1. Adam on the GPU follows torch -----------------------------------------------------------------
def test_adam_on_gl_follows_torch(dialect: str, gl_runtime: Any) -> None:
    """Eight Adam steps with betas (0.9, 0.999): 1 - beta2 was computed as 1 - exp(ln(beta2)), off by
    ~1e-4 relative on llvmpipe (parameters 4.6e-6 away from torch); the float32 recurrences keep
    them within rounding (1.8e-7)."""
    glcomp.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    tmodel = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    with torch.no_grad():
        for k, p in tmodel.named_parameters():
            p.copy_(torch.tensor(model.state_dict()[k]))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 6)).astype(np.float32)
    y = rng.normal(size=(5, 3)).astype(np.float32)
    prog = glcomp.compile(model, {"x": x.shape}, nn.MSELoss(), optim.Adam(lr=0.05), target=dialect)
    topt = torch.optim.Adam(tmodel.parameters(), lr=0.05)
    with gl_runtime(prog) as rt:
        for _ in range(8):
            topt.zero_grad()
            torch.nn.functional.mse_loss(tmodel(torch.tensor(x)), torch.tensor(y)).backward()
            topt.step()
            rt.train_step(x=x, y=y)
        state, opt_state = rt.state_dict(), rt.optimizer_state()
    for k, p in tmodel.named_parameters():
        np.testing.assert_allclose(state[k], p.detach().numpy(), rtol=2e-6, atol=5e-7, err_msg=k)
    for i, beta in ((1, 0.9), (2, 0.999)):
        assert float(opt_state[f"opt.bias_correction{i}"]) == pytest.approx(1 - beta**8, rel=1e-6)
        assert float(opt_state[f"opt.beta{i}_power"]) == pytest.approx(beta**8, rel=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.9, 0.999])
def test_bias_correction_recurrence_stays_within_a_few_ulp(beta: float) -> None:
    """The scheme Adam lowers, run in float32 by the reference runtime past the switch from the
    c recurrence to 1 - d (t = 693 for beta = 0.999)."""
    from glcomp.ir.graph import Graph
    from glcomp.ir.tensor import Tensor
    from glcomp.optim import _bias_correction

    g = Graph()
    c, d = (Tensor(g, g.add_input(n, (), "state")) for n in ("c", "d"))
    new_c, new_d, bc = _bias_correction(c, d, beta)
    g.outputs = {"c": new_c.node, "d": new_d.node, "bc": bc.node}
    state = {"c": np.float32(0), "d": np.float32(1)}
    worst = 0.0
    for t in range(1, 1501):
        out = evaluate(g, state)
        state = {"c": out["c"], "d": out["d"]}
        exact = 1 - beta**t
        worst = max(worst, abs(float(out["bc"]) - exact) / exact)
    assert worst < 2e-6, worst  # exp(t ln beta) on llvmpipe: 1.1e-4 at t = 1 for beta = 0.999


# -- 2. torch semantics -----------------------------------------------------------------------------
def test_max_and_min_with_dim_return_values_and_indices_like_torch() -> None:
    x = np.array([[1.0, 5.0, 5.0, -2.0], [3.0, -1.0, 3.0, 0.0], [-4.0, -4.0, -7.0, -7.0]], np.float32)
    tx = torch.tensor(x)
    for method in ("max", "min"):
        for dim, keepdim in ((1, False), (0, True), (-1, True)):
            out = predict_graph(lambda t, m=method, d=dim, k=keepdim: tuple(getattr(t, m)(d, k)), x)
            expected = getattr(tx, method)(dim, keepdim)
            np.testing.assert_array_equal(out["output.0"], expected.values.numpy())
            np.testing.assert_array_equal(out["output.1"], expected.indices.numpy().astype(np.float32))
        assert float(predict_graph(lambda t, m=method: getattr(t, m)(), x)) == getattr(tx, method)().item()
    named = predict_graph(lambda t: (t.max(1).values, t.max(1).indices, t.amin(0)), x)
    np.testing.assert_array_equal(named["output.0"], tx.max(1).values.numpy())
    np.testing.assert_array_equal(named["output.1"], tx.max(1).indices.numpy())
    np.testing.assert_array_equal(named["output.2"], tx.amin(0).numpy())
    np.testing.assert_array_equal(predict_graph(lambda t: t.argmax(), x), tx.argmax().item())
    np.testing.assert_array_equal(predict_graph(lambda t: t.max(t * 0.5), x), np.maximum(x, x * 0.5))
    np.testing.assert_array_equal(predict_graph(lambda t: glcomp.minimum(t, 0.0), x), np.minimum(x, 0))


def test_max_with_dim_sends_the_gradient_to_the_first_maximum_like_torch() -> None:
    x = np.array([[1.0, 5.0, 5.0], [2.0, 2.0, 2.0]], np.float32)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = nn.Parameter(x.copy())

        def forward(self, x: Any) -> Any:
            return (self.p + x).max(1).values

    tp = torch.tensor(x, requires_grad=True)
    tp.max(1).values.sum().backward()  # the mask: 1 at the first maximum of each row
    prog = glcomp.compile(Net(), {"x": (2, 3)}, loss=nn.MSELoss())
    # loss = mean(v ** 2) over 2 rows: dloss/dv = v, so dloss/dp = v * mask.
    grads = prog.runtime("reference").gradients(x=np.zeros((2, 3), np.float32), y=np.zeros(2, np.float32))
    np.testing.assert_allclose(grads["p"], tp.grad.numpy() * x.max(1)[:, None], rtol=1e-6)


def test_comparisons_are_float_masks_like_torch() -> None:
    x = np.array([[-1.0, 0.0, 2.0], [np.inf, -np.inf, 3.0]], np.float32)
    y = np.array([[0.0, 0.0, 1.0], [np.inf, -np.inf, 4.0]], np.float32)
    fns = {
        "gt": lambda a, b: a > b,
        "ge": lambda a, b: a >= b,
        "lt": lambda a, b: a < b,
        "le": lambda a, b: a <= b,
        "eq": lambda a, b: a == b,
        "ne": lambda a, b: a != b,
    }

    class Two(nn.Module):
        def __init__(self, fn: Any) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, a: Any, b: Any) -> Any:
            return self.fn(a, b), self.fn(a, 0.0), self.fn(0.0, b)

    for name, fn in fns.items():
        prog = glcomp.compile(Two(fn), {"a": x.shape, "b": y.shape})
        out = evaluate(prog.graphs["predict"], {"a": x, "b": y})
        tx, ty = torch.tensor(x), torch.tensor(y)
        np.testing.assert_array_equal(out["output.0"], fn(tx, ty).float().numpy(), err_msg=name)
        np.testing.assert_array_equal(out["output.1"], fn(tx, 0.0).float().numpy(), err_msg=name)
        np.testing.assert_array_equal(out["output.2"], fn(0.0, ty).float().numpy(), err_msg=name)

    # Masks in arithmetic and where; an inf in the branch not taken does not leak.
    out = predict_graph(lambda t: glcomp.where(t > 0, t, (t - 1.0) * -np.inf) + (t <= 0) * 2.0, x[:1])
    np.testing.assert_array_equal(out, np.where(x[:1] > 0, x[:1], -np.inf * (x[:1] - 1)) + (x[:1] <= 0) * 2.0)


def test_tensor_equality_is_elementwise_and_hashing_is_by_identity() -> None:
    seen: list[Any] = []

    def fn(t: Any) -> Any:
        mask = t == t
        seen.append(mask)
        assert isinstance(mask, glcomp.Tensor)
        table = {t: "t", mask: "mask"}
        assert table[t] == "t" and table[mask] == "mask" and len({t, t, mask}) == 2
        with pytest.raises(GlcompError, match="truth value"):
            bool(t == 1.0)
        return mask

    np.testing.assert_array_equal(predict_graph(fn, np.ones((2, 2), np.float32)), np.ones((2, 2)))
    assert seen


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda t: np.tanh(t), "np.tanh"),
        (lambda t: np.exp(t), "np.exp"),
        (lambda t: np.asarray(t), "np.asarray"),
        (lambda t: np.array(t), "np.array"),
        (lambda t: np.mean(t), "np.mean"),
        (lambda t: np.concatenate([t, t]), "np.concatenate"),
        (lambda t: np.ones((2, 3)) * t, "cannot combine"),
    ],
)
def test_numpy_functions_on_traced_tensors_raise(call: Any, name: str) -> None:
    with pytest.raises(GlcompError, match=name.replace(".", r"\.")):
        glcomp.compile(Fn(call), {"x": (2, 3)})


def test_numpy_scalars_still_combine_with_tensors() -> None:
    x = np.arange(4, dtype=np.float32)
    out = predict_graph(lambda t: (np.float32(2) * t, np.float64(1) - t, np.float32(1) < t), x)
    np.testing.assert_array_equal(out["output.0"], 2 * x)
    np.testing.assert_array_equal(out["output.1"], 1 - x)
    np.testing.assert_array_equal(out["output.2"], (1 < x).astype(np.float32))


MODEL = nn.Sequential(nn.Linear(4, 2))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"optimizer": optim.Adam}, r"got the class Adam; pass an instance, e\.g\. optimizer=Adam\("),
        ({"optimizer": "adam"}, "optimizer must be a glcomp.optim optimizer"),
        ({"optimizer": torch.optim.Adam}, "optimizer: got the class Adam"),
        ({"loss": nn.MSELoss}, r"loss: got the class MSELoss; pass an instance, e.g. loss=MSELoss\(\)"),
        ({"loss": "mse"}, "loss must be a glcomp.nn loss module"),
        ({"loss": nn.Linear(2, 2)}, "loss must be a glcomp.nn loss module"),
        ({"loss": np.zeros(2)}, "loss must be a glcomp.nn loss module"),
        ({"model": nn.Linear}, r"model: got the class Linear; pass an instance"),
        ({"model": "net.py"}, "model must be a glcomp.nn.Module instance"),
        ({"inputs": [(8, 4)]}, "inputs must be a non-empty dict"),
        ({"inputs": {}}, "inputs must be a non-empty dict"),
        ({"inputs": {"x": "8,4"}}, r"inputs\['x'\] must be a shape"),
        ({"inputs": {"x": (8, 4.5)}}, r"inputs\['x'\] must be a shape"),
        ({"inputs": {"x": 8}}, r"inputs\['x'\] must be a shape"),
        ({"inputs": {1: (8, 4)}}, "inputs: name 1"),
        ({"target": "webgl3"}, "unknown target 'webgl3'"),
        ({"target_name": 3}, "target_name must be a name"),
        ({"clip_grad_norm": "1"}, "clip_grad_norm must be a positive number"),
        ({"clip_grad_value": 1.0, "optimizer": None}, "clip_grad_value applies to the train step"),
        ({"max_texture_size": "big"}, "max_texture_size must be a positive int"),
        ({"max_texure_size": 64}, r"unknown compile options \['max_texure_size'\]"),
        ({"passes": {"fuse": False}}, r"unknown passes \['fuse'\]"),
        ({"passes": ["fusion"]}, "passes must be a dict"),
    ],
)
def test_compile_names_each_mistaken_argument(kwargs: dict[str, Any], message: str) -> None:
    args = {"model": MODEL, "inputs": {"x": (8, 4)}, "loss": nn.CrossEntropyLoss(), "optimizer": optim.SGD()}
    args |= kwargs
    with pytest.raises(GlcompError, match=message):
        glcomp.compile(args.pop("model"), args.pop("inputs"), **args)


def test_optimizer_hyperparameters_are_checked() -> None:
    with pytest.raises(GlcompError, match="betas must be a pair"):
        optim.Adam(betas=0.9)
    with pytest.raises(GlcompError, match="eps must be a number"):
        optim.Adam(eps="small")


def test_runtimes_refuse_positional_inputs(gl_runtime: Any) -> None:
    prog = glcomp.compile(MODEL, {"x": (8, 4)}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD())
    x, y = np.zeros((8, 4), np.float32), np.zeros(8, np.int64)
    with gl_runtime(prog) as gl:
        for rt in (prog.runtime("reference"), gl):
            with pytest.raises(GlcompError, match=r"pass inputs by name: predict\(x=...\)"):
                rt.predict(x)
            with pytest.raises(GlcompError, match=r"pass inputs by name: train_step\(x=..., y=...\)"):
                rt.train_step(x, y)
            with pytest.raises(GlcompError, match=r"pass inputs by name: gradients\(x=..., y=...\)"):
                rt.gradients(x, y=y)
            with pytest.raises(GlcompError, match="input 'x' must hold numbers"):
                rt.predict(x=np.array([["a"] * 4] * 8))


# -- 3. NaN propagates like torch -------------------------------------------------------------------
NAN_FUNCTIONS = {
    "relu": lambda t: t.relu(),
    "leaky_relu": lambda t: F.leaky_relu(t, 0.1),
    "maximum": lambda t: glcomp.maximum(t, 0.5),
    "maximum_left": lambda t: glcomp.maximum(0.5, t),
    "minimum": lambda t: glcomp.minimum(t, 0.5),
    # max(inf, -inf) is inf, not the NaN of inf + -inf: only a NaN operand makes a NaN
    "maximum_opposite": lambda t: glcomp.maximum(t, -t),
    "minimum_opposite": lambda t: glcomp.minimum(-t, t),
    "max_reduce": lambda t: t.amax(-1),
    "max_all": lambda t: t.max(),
    "max_dim": lambda t: tuple(t.max(0)),
    "max_pool": lambda t: F.max_pool2d(t.reshape(1, 1, 4, 4), 2),
    "sigmoid": lambda t: t.sigmoid(),
    "tanh": lambda t: t.tanh(),
    "softmax": lambda t: F.softmax(t, -1),
}


def nan_input() -> np.ndarray:
    x = np.arange(16, dtype=np.float32).reshape(4, 4) - 6
    x[0, 1] = x[2, 3] = np.nan
    x[3, 0] = np.inf
    return x


@pytest.mark.parametrize("name", sorted(NAN_FUNCTIONS))
def test_nan_propagates_on_gl_like_numpy_and_torch(
    name: str, dialect: str, gl_runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runtimes refuse NaN inputs, so the check is bypassed to put NaN where a diverged model
    would have it. GLSL's max() returned the other operand (relu(NaN) was 0)."""
    monkeypatch.setattr(
        gl_module, "check_feeds", lambda entry, specs, given: {k: np.asarray(v) for k, v in given.items()}
    )
    x = nan_input()
    prog = glcomp.compile(Fn(NAN_FUNCTIONS[name]), {"x": x.shape}, target=dialect)
    with np.errstate(invalid="ignore"):
        expected = evaluate(prog.graphs["predict"], {"x": x})
    with gl_runtime(prog) as rt:
        got = rt.run("predict", {"x": x})
    assert sorted(got) == sorted(expected)
    assert any(np.isnan(v).any() for v in expected.values()), f"{name}: the reference lost the NaN"
    for key in expected:
        np.testing.assert_array_equal(np.isnan(got[key]), np.isnan(expected[key]), err_msg=f"{name} {key}")
        finite = ~np.isnan(expected[key])
        np.testing.assert_allclose(got[key][finite], expected[key][finite], rtol=1e-6, err_msg=name)
    if name == "max_dim":  # values and the index of the (first) NaN, as torch
        tout = torch.tensor(x).max(0)
        np.testing.assert_array_equal(expected["output.0"], tout.values.numpy())
        np.testing.assert_array_equal(expected["output.1"], tout.indices.numpy())
    if name in ("relu", "sigmoid", "tanh", "max_pool"):  # the reference agrees with torch
        tfn = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}.get(name)
        tx = torch.tensor(x)
        tout = torch.nn.functional.max_pool2d(tx.reshape(1, 1, 4, 4), 2) if tfn is None else tfn(tx)
        np.testing.assert_array_equal(np.isnan(expected["output"]), torch.isnan(tout).numpy())


def test_glcomp_train_stops_at_a_non_finite_loss(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "diverges.py"
    source.write_text(
        textwrap.dedent(
            """
            import numpy as np
            import glcomp
            from glcomp import nn, optim

            def build():
                glcomp.manual_seed(0)
                x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32) * 10
                y = x @ np.ones((4, 2), np.float32)
                return {
                    "model": nn.Sequential(nn.Linear(4, 2)),
                    "inputs": {"x": (8, 4)},
                    "loss": nn.MSELoss(),
                    "optimizer": optim.SGD(lr=10.0),
                    "data": {"x_train": x, "y_train": y, "x_test": x[:8], "y_test": y[:8]},
                    "batch_size": 8,
                    "epochs": 20,
                }
            """
        )
    )
    status = main(["train", str(source), "--runtime", "reference", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and err[0].startswith("error: training diverged at step "), err
