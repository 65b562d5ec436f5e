"""User mistakes raise GlcompError (a ValueError) naming the model part, the tensor and the shapes."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import GlcompError, nn, optim


def message(fn: Any) -> str:
    with pytest.raises(GlcompError) as info:
        fn()
    assert isinstance(info.value, ValueError)
    return str(info.value)


def has(text: str, *parts: str) -> None:
    for part in parts:
        assert part in text, f"{part!r} missing from the message: {text}"


class MatmulModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(np.zeros((5, 2)))

    def forward(self, x: Any) -> Any:
        return x @ self.w


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x: Any) -> Any:
        return self.features(x)


def classifier() -> nn.Sequential:
    glcomp.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))


# -- tracing ---------------------------------------------------------------------------------------
def test_wrong_input_rank_names_layer_and_shapes() -> None:
    text = message(lambda: glcomp.compile(nn.Sequential(nn.Conv2d(1, 2, 3)), {"x": (8, 8)}))
    has(text, "0 (Conv2d)", "(N, 1, H, W)", "(8, 8)")


def test_batchnorm_channel_mismatch() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(4))
    has(message(lambda: glcomp.compile(model, {"x": (8, 4)})), "1 (BatchNorm1d)", "4 channels", "(8, 3)")


def test_mismatched_linear_sizes() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(5, 2))
    has(message(lambda: glcomp.compile(model, {"x": (8, 4)})), "2 (Linear)", "(..., 5)", "(8, 3)")


def test_nested_module_path() -> None:
    has(message(lambda: glcomp.compile(Nested(), {"x": (8, 4)})), "features.2 (Linear)", "(..., 4)", "(8, 3)")


def test_matmul_size_mismatch_in_user_module() -> None:
    has(message(lambda: glcomp.compile(MatmulModel(), {"x": (8, 4)})), "(MatmulModel)", "(8, 4)", "(5, 2)")
    in_sequential = nn.Sequential(nn.Identity(), MatmulModel())
    has(message(lambda: glcomp.compile(in_sequential, {"x": (8, 4)})), "1 (MatmulModel)", "(8, 4) @ (5, 2)")


def test_unknown_and_missing_input_names_at_compile() -> None:
    model = classifier()
    has(
        message(lambda: glcomp.compile(model, {"x": (8, 4), "z": (3,)})), "unknown input names ['z']", "['x']"
    )
    has(message(lambda: glcomp.compile(model, {"inputs": (8, 4)})), "'inputs'", "['x']")
    has(message(lambda: glcomp.compile(model, {"x": (8, 0)})), "'x'", "positive")


def test_forward_must_return_tensors() -> None:
    class Bad(nn.Module):
        def forward(self, x: Any) -> Any:
            return 3

    has(message(lambda: glcomp.compile(Bad(), {"x": (2,)})), "(Bad)", "int")


def test_module_called_outside_a_trace() -> None:
    has(message(lambda: nn.Linear(3, 4)(np.zeros((2, 3)))), "Linear", "outside a trace")


def test_cross_entropy_needs_class_scores() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Flatten(0))
    has(
        message(lambda: glcomp.compile(model, {"x": (8, 4)}, loss=nn.CrossEntropyLoss())),
        "CrossEntropyLoss",
        "(24,)",
    )


# -- running ---------------------------------------------------------------------------------------
@pytest.fixture
def runtime() -> Any:
    prog = glcomp.compile(
        classifier(), {"x": (8, 4)}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.1)
    )
    return prog.runtime("reference")


X = np.zeros((8, 4))


def test_wrong_input_shape_at_predict(runtime: Any) -> None:
    has(message(lambda: runtime.predict(x=np.zeros((7, 4)))), "'x'", "(8, 4)", "(7, 4)")
    has(message(lambda: runtime.predict(x=np.zeros((8, 4, 1)))), "'x'", "(8, 4)", "(8, 4, 1)")


def test_unknown_and_missing_names_at_run_time(runtime: Any) -> None:
    has(message(lambda: runtime.predict(x=X, z=X)), "unknown input names ['z']")
    has(message(lambda: runtime.predict()), "missing", "'x'")
    has(message(lambda: runtime.train_step(x=X)), "missing", "'y'")


def test_non_finite_inputs(runtime: Any) -> None:
    x = X.copy()
    x[1, 2] = np.nan
    has(message(lambda: runtime.predict(x=x)), "'x'", "NaN")


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ([0, 1, 2, 3, 0, 1, 2, 2], ["'y'", "[0, 3)", "3"]),
        ([0, 1, 2, -1, 0, 1, 2, 2], ["'y'", "[0, 3)", "-1"]),
        ([0, 1, 2, 1.5, 0, 1, 2, 2], ["'y'", "integers"]),
        ([0, 1, 2], ["'y'", "(8,)", "(3,)"]),
    ],
    ids=["too-large", "negative", "fractional", "wrong-shape"],
)
def test_bad_targets_at_train_step(runtime: Any, labels: list[float], expected: list[str]) -> None:
    before = {k: v.copy() for k, v in runtime.params.items()}
    has(message(lambda: runtime.train_step(x=X, y=np.array(labels))), *expected)
    has(message(lambda: runtime.gradients(x=X, y=np.array(labels))), *expected)
    for k, v in before.items():  # nothing ran
        np.testing.assert_array_equal(runtime.params[k], v)


def test_predict_only_program_has_no_training() -> None:
    rt = glcomp.compile(classifier(), {"x": (8, 4)}).runtime("reference")
    has(message(lambda: rt.train_step(x=X, y=np.zeros(8))), "train_step", "loss")


# -- state dicts -----------------------------------------------------------------------------------
def good_state() -> dict[str, np.ndarray]:
    return {k: np.full_like(v, 0.5) for k, v in classifier().state_dict().items()}


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda s: s.pop("2.bias"), ["missing keys ['2.bias']"]),
        (lambda s: s.update({"3.weight": np.zeros((3, 3))}), ["unexpected keys ['3.weight']"]),
        (lambda s: s.update({"0.weight": np.zeros((4, 6))}), ["'0.weight'", "(6, 4)", "(4, 6)"]),
        (lambda s: s.update({"2.bias": np.array([0.0, np.inf, 1.0])}), ["'2.bias'", "infinite"]),
    ],
    ids=["missing", "extra", "wrong-shape", "non-finite"],
)
def test_load_state_dict_rejects_and_loads_nothing(edit: Any, expected: list[str]) -> None:
    model = classifier()
    before = model.state_dict()
    state = good_state()  # every other entry is valid and differs from the model's
    edit(state)
    text = message(lambda: model.load_state_dict(state))
    has(text, "Sequential", "nothing was loaded", *expected)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"{k} was partially loaded")

    rt = glcomp.compile(model, {"x": (8, 4)}).runtime("reference")
    text = message(lambda: rt.load_state_dict(state))
    has(text, "nothing was loaded", *expected)
    for k, v in rt.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"runtime {k} was partially loaded")


def test_load_state_dict_non_strict_allows_missing_only() -> None:
    model = classifier()
    state = good_state()
    del state["2.bias"]
    model.load_state_dict(state, strict=False)
    np.testing.assert_array_equal(model.state_dict()["0.weight"], np.full((6, 4), 0.5))
    state["0.bias"] = np.zeros(5)
    has(message(lambda: model.load_state_dict(state, strict=False)), "'0.bias'", "(6,)", "(5,)")


# -- options ---------------------------------------------------------------------------------------
def test_bad_compile_options() -> None:
    model = classifier()
    has(message(lambda: glcomp.compile(model, {"x": (8, 4)}, target="webgl9")), "webgl9", "webgl2")
    has(message(lambda: glcomp.compile(model, {"x": (8, 4)}, optimizer=optim.SGD(lr=0.1))), "loss")
    has(message(lambda: glcomp.compile(model, {})), "inputs")
    has(message(lambda: optim.SGD(lr=-1.0)), "learning rate")
    has(message(lambda: optim.SGD(lr=0.1, nesterov=True)), "nesterov", "momentum")
    frozen = classifier().requires_grad_(False)
    has(message(lambda: glcomp.compile(frozen, {"x": (8, 4)}, loss=nn.CrossEntropyLoss())), "requires_grad")


def test_messages_are_single_line() -> None:
    text = message(lambda: glcomp.compile(nn.Sequential(nn.Linear(4, 3), nn.Linear(5, 2)), {"x": (8, 4)}))
    assert "\n" not in text and re.search(r"\b1 \(Linear\)", text)
