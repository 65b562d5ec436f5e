"""The texture inspector: ``rt.inspect(name)`` on the GL and reference runtimes (docs/inspect.md).

GL reads what the bundle kept (compile option ``inspect=[...]``, states, entry outputs); the
reference evaluates any tensor of the last entry run again. Both must give the same arrays, and
keeping or reading a tensor must not change the training by a single bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim
from glcomp.codegen.bundle import load_bundle
from glcomp.errors import GlcompError
from glcomp.ir.names import program_tensor_nodes

RTOL, ATOL = 1e-4, 1e-5
STEPS = 4


def _mlp(**options: Any) -> glcomp.Program:
    glcomp.manual_seed(11)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))
    return glcomp.compile(
        model, {"x": (6, 12)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=1e-2), **options
    )


def _cnn(**options: Any) -> glcomp.Program:
    glcomp.manual_seed(12)
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1),
        nn.BatchNorm2d(3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(3 * 3 * 3, 2),
    )
    return glcomp.compile(
        model,
        {"x": (4, 1, 6, 6)},
        loss=nn.CrossEntropyLoss(),
        optimizer=optim.SGD(lr=0.1, momentum=0.9),
        **options,
    )


MODELS = {
    "mlp": (_mlp, (6, 12), 3, ["0", "1", "3", "grad:0.weight", "grad:4.bias", "%10"]),
    "cnn": (_cnn, (4, 1, 6, 6), 2, ["0", "1", "3", "grad:0.weight", "grad:5.weight"]),
}


def _batches(model: str, count: int = STEPS) -> list[dict[str, np.ndarray]]:
    _, shape, classes, _ = MODELS[model]
    rng = np.random.default_rng(7)
    return [
        {"x": rng.normal(size=shape).astype(np.float32), "y": rng.integers(0, classes, size=shape[0])}
        for _ in range(count)
    ]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_gl_inspect_equals_reference(gl_runtime: Any, model: str) -> None:
    make, _, _, names = MODELS[model]
    prog = make(inspect=names)
    ref = prog.runtime("reference")
    weights = ["0.weight", *(k for k in prog.opt_state if k.endswith("0.weight.momentum_buffer"))]
    with gl_runtime(prog) as gl:
        for batch in _batches(model):  # inspect at step k = STEPS
            gl.train_step(**batch)
            ref.train_step(**batch)
        for name in [*names, *weights, "loss"]:
            got, want = gl.inspect(name), ref.inspect(name)
            assert got.shape == want.shape, name
            assert np.abs(want).max() > 0, f"{name} is all zeros: nothing compared"
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=name)
        # after predict, a model part's output is predict's (eval mode, the updated weights)
        x = _batches(model)[0]["x"]
        gl.predict(x=x)
        ref.predict(x=x)
        np.testing.assert_allclose(gl.inspect("0"), ref.inspect("0"), rtol=RTOL, atol=ATOL)


def test_shapes_are_the_plans() -> None:
    prog = _cnn()
    ref = prog.runtime("reference")
    ref.train_step(**_batches("cnn")[0])
    assert ref.inspect("0").shape == (4, 3, 6, 6)  # Conv2d output
    assert ref.inspect("3").shape == (4, 3, 3, 3)  # MaxPool2d output
    assert ref.inspect("grad:0.weight").shape == prog.params["0.weight"].shape
    assert ref.inspect("loss").shape == ()
    assert ref.inspect("1.running_mean").shape == (3,)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_inspection_does_not_change_training(gl_runtime: Any, model: str) -> None:
    make, _, _, names = MODELS[model]
    plain, kept = make(), make(inspect=names)
    with gl_runtime(plain) as a, gl_runtime(kept) as b:
        la, lb = [], []
        for batch in _batches(model):
            la.append(a.train_step(**batch))
            lb.append(b.train_step(**batch))
            for name in names:  # reading between steps changes nothing either
                b.inspect(name)
        # Within one float32 rounding: the GL runtime compiles every fragment output `invariant`
        # (IEEE results for inf and NaN, glcomp/runtime/gl.py exact_outputs), and Mesa then
        # rounds a kept tensor's copied chain and the value it shadows in separately compiled
        # shaders; without `invariant` the two runs are bit-identical (docs/inspect.md).
        np.testing.assert_allclose(la, lb, rtol=1e-6, atol=0)
        sa, sb = a.state_dict(), b.state_dict()
        for k in sa:
            np.testing.assert_allclose(sa[k], sb[k], rtol=1e-6, atol=1e-9, err_msg=k)
        x = _batches(model)[0]["x"]
        np.testing.assert_allclose(a.predict(x=x), b.predict(x=x), rtol=1e-6, atol=1e-9)  # no extra outputs
        assert sorted(a.gradients(**_batches(model)[0])) == sorted(b.gradients(**_batches(model)[0]))


def test_inspect_in_rgba8_storage_is_exact_and_changes_nothing(gl_runtime: Any) -> None:
    plain, kept = _mlp(storage="rgba8"), _mlp(storage="rgba8", inspect=["1", "grad:0.weight"])
    ref = kept.runtime("reference")
    with gl_runtime(plain) as a, gl_runtime(kept) as b:
        for batch in _batches("mlp"):
            assert a.train_step(**batch) == b.train_step(**batch)
            ref.train_step(**batch)
        np.testing.assert_allclose(b.inspect("1"), ref.inspect("1"), rtol=RTOL, atol=ATOL)


def test_names_are_explains() -> None:
    """`%N` are the node ids `explain(dump_after=...)` prints for the entry; model parts are the
    paths explain lists under "from"."""
    prog = _mlp()
    nodes = program_tensor_nodes(prog.graphs)["train_step"]
    dump = prog.explain(dump_after="memplan")
    train = dump[dump.index("plan train_step") :]
    for name in ("%10", "%9"):
        assert name in train and nodes[name] == int(name[1:])
    assert "0 (Linear)" in prog.explain() and "0" in nodes and "grad:0.weight" in nodes


def test_saved_bundle_keeps_inspect_outputs(gl_runtime: Any, tmp_path: Path) -> None:
    prog = _mlp(inspect=["1"])
    prog.save(tmp_path / "b")
    loaded = glcomp.load(tmp_path / "b")
    assert "inspect:1" in load_bundle(tmp_path / "b").manifest["entries"]["train_step"]["outputs"]
    with gl_runtime(loaded) as rt:
        rt.train_step(**_batches("mlp")[0])
        assert rt.inspect("1").shape == (6, 16)


def test_errors(gl_runtime: Any) -> None:
    with pytest.raises(
        GlcompError, match=r"no tensor named 'grad:0\.weigth'.*near matches: .*'grad:0\.weight'"
    ):
        _mlp(inspect=["grad:0.weigth"]).bundle()
    with pytest.raises(GlcompError, match="inspect must be a list"):
        _mlp(inspect="0")
    with pytest.raises(GlcompError, match="non-empty strings"):
        _mlp(inspect=[3])
    with pytest.raises(GlcompError, match="storage='f32' or 'rgba8'"):
        _mlp(inspect=["0"], storage="f16")
    prog = _mlp(inspect=["1", "grad:0.weight"])
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        for rt in (gl, ref):
            with pytest.raises(GlcompError, match="no entry has run yet"):
                rt.inspect("1")
            assert rt.inspect("0.weight").shape == (16, 12)  # states: always readable
            rt.predict(x=_batches("mlp")[0]["x"])
            with pytest.raises(
                GlcompError,
                match=r"'grad:0\.weight' is computed by gradients, train_step; the last entry run was pre",
            ):
                rt.inspect("grad:0.weight")
            with pytest.raises(GlcompError, match=r"no tensor named '0\.wieght'.*'0\.weight'"):
                rt.inspect("0.wieght")
        # GL holds only what was kept: the hint says how to keep it
        with pytest.raises(GlcompError, match=r"compile with inspect=\['3'\]"):
            gl.inspect("3")
        assert ref.inspect("3").shape == (6, 8)  # the reference evaluates any tensor
