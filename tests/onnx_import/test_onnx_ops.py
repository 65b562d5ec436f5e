"""The ONNX importer's compositions, one node at a time, against ONNX's reference evaluator
(onnx.reference): attributes and opset forms the on-disk suite (test_onnx_suite.py) does not
reach, on the reference runtime and some on GL; refusals name the node and its op."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glcomp
import glcomp.onnx as gonnx
from glcomp.errors import GlcompError

RTOL, ATOL = 1e-4, 1e-5


def model(
    nodes: list[Any],
    inputs: dict[str, tuple[int, ...]],
    outputs: list[str],
    opset: int = 17,
    initializers: dict[str, np.ndarray] | None = None,
    elem: int = TensorProto.FLOAT,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, elem, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, elem, None) for n in outputs],
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(
    proto: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    tmp_path: Path,
    gl: Any = None,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> glcomp.Program:
    """glcomp's outputs (reference runtime, and GL with `gl`) equal ONNX's reference evaluator's."""
    expected = ReferenceEvaluator(proto).run(None, feeds)
    _declare_outputs(proto, [e.shape for e in expected])
    path = tmp_path / "m.onnx"
    onnx.save(proto, str(path))
    module = gonnx.load(path)
    program = glcomp.compile(module, {k: v.shape for k, v in feeds.items()})
    runs = [program.runtime("reference").predict(**feeds)]
    if gl is not None:
        with gl(program) as rt:
            runs.append(rt.predict(**feeds))
    for got in runs:
        outs = [got] if len(expected) == 1 else [got[f"output.{i}"] for i in range(len(expected))]
        for g, e in zip(outs, expected, strict=True):
            assert g.shape == e.shape
            np.testing.assert_allclose(g, e.astype(np.float32), rtol=rtol, atol=atol)
    return program


def _declare_outputs(proto: onnx.ModelProto, shapes: list[tuple[int, ...] | None]) -> None:
    """The checker wants each graph output's shape; a refused model declares rank-1 symbolic ones."""
    for value, shape in zip(proto.graph.output, shapes, strict=True):
        dims = value.type.tensor_type.shape.dim
        for d in shape if shape is not None else ("n",):
            dim = dims.add()
            if isinstance(d, str):
                dim.dim_param = d
            else:
                dim.dim_value = int(d)


def _declared(proto: onnx.ModelProto, shapes: list[tuple[int, ...] | None]) -> onnx.ModelProto:
    _declare_outputs(proto, shapes)
    return proto


def refused(proto: onnx.ModelProto, feeds: dict[str, tuple[int, ...]], tmp_path: Path, match: str) -> None:
    _declare_outputs(proto, [None] * len(proto.graph.output))
    path = tmp_path / "m.onnx"
    onnx.save(proto, str(path))
    with pytest.raises(GlcompError, match=match):
        glcomp.compile(gonnx.load(path), feeds)


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


# -- variadic and elementwise ----------------------------------------------------------------------
@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
def test_variadic_ops_broadcast_three_inputs(op: str, tmp_path: Path, gl_runtime: Any) -> None:
    proto = model(
        [helper.make_node(op, ["a", "b", "c"], ["y"])], {"a": (2, 3, 4), "b": (3, 1), "c": (4,)}, ["y"]
    )
    feeds = {"a": rand(2, 3, 4), "b": rand(3, 1, seed=1), "c": rand(4, seed=2)}
    check(proto, feeds, tmp_path, gl_runtime)


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("Elu", {"alpha": 0.7}),
        ("Selu", {}),
        ("Celu", {"alpha": 1.3}),
        ("Softplus", {}),
        ("Softsign", {}),
        ("Sign", {}),
        ("Shrink", {"lambd": 0.6, "bias": 0.2}),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
    ],
)
def test_activations(op: str, attrs: dict[str, float], tmp_path: Path) -> None:
    x = rand(3, 5) * 3
    x[0, :3] = [0.0, 0.6, -0.6]
    check(model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x.shape}, ["y"]), {"x": x}, tmp_path)


def test_prelu_broadcasts_a_trainable_slope(tmp_path: Path) -> None:
    slope = np.array([[0.1], [-0.3], [2.0]], np.float32)  # (3, 1) against (2, 3, 4)
    proto = model(
        [helper.make_node("PRelu", ["x", "s"], ["y"])], {"x": (2, 3, 4)}, ["y"], initializers={"s": slope}
    )
    program = check(proto, {"x": rand(2, 3, 4)}, tmp_path)
    assert "s" in program.params


def test_pow_with_a_tensor_exponent(tmp_path: Path, gl_runtime: Any) -> None:
    """Negative bases with integer exponents keep their sign; with fractions they give NaN; 0 ** 0
    is 1, 0 ** 2 is 0, 0 ** -1 is inf; a constant exponent array works too."""
    b = np.array([-2, -2, -2, -0.5, 0, 0, 0, 3, -3, -1.5, 2, 1.5], np.float32)
    e = np.array([2, 3, 0.5, -3, 0, 2, -1, 1.7, -2, 2.5, 7, -0.25], np.float32)
    proto = model([helper.make_node("Pow", ["b", "e"], ["y"])], {"b": b.shape, "e": e.shape}, ["y"])
    with np.errstate(all="ignore"):
        check(proto, {"b": b, "e": e}, tmp_path, gl_runtime)
        const = model(
            [helper.make_node("Pow", ["b", "e"], ["y"])], {"b": b.shape}, ["y"], initializers={"e": e}
        )
        check(const, {"b": b}, tmp_path)


# -- movement --------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_modes_with_inputs_axes_and_negative_pads(mode: str, tmp_path: Path, gl_runtime: Any) -> None:
    """Opset 19: pads, constant_value and axes as inputs."""
    inits = {
        "pads": np.array([2, 0, 1, 3], np.int64),  # axis 3 begin, axis 1 begin, then the ends
        "value": np.array(1.5, np.float32),
        "axes": np.array([3, 1], np.int64),
    }
    ins = ["x", "pads", "value", "axes"] if mode == "constant" else ["x", "pads", "", "axes"]
    proto = model(
        [helper.make_node("Pad", ins, ["y"], mode=mode)],
        {"x": (2, 4, 3, 5)},
        ["y"],
        opset=19,
        initializers=inits,
    )
    check(proto, {"x": rand(2, 4, 3, 5)}, tmp_path, gl_runtime)


def test_negative_pads_crop(tmp_path: Path) -> None:
    """onnx.reference refuses negative pads, so the expected value is numpy's slice and pad."""
    node = helper.make_node("Pad", ["x"], ["y"], mode="edge", pads=[-1, 2, 0, -2])
    proto = _declared(model([node], {"x": (4, 5)}, ["y"], opset=10), [(3, 5)])
    onnx.save(proto, str(tmp_path / "m.onnx"))
    x = rand(4, 5)
    got = glcomp.compile(gonnx.load(tmp_path / "m.onnx"), {"x": x.shape}).runtime("reference").predict(x=x)
    np.testing.assert_array_equal(got, np.pad(x[1:, :3], [(0, 0), (2, 0)], mode="edge"))


def test_pad_opset2_attributes(tmp_path: Path) -> None:
    proto = model(
        [helper.make_node("Pad", ["x"], ["y"], mode="constant", pads=[0, 1, 2, 0, 3, 1], value=-2.0)],
        {"x": (2, 3, 4)},
        ["y"],
        opset=2,
    )
    check(proto, {"x": rand(2, 3, 4)}, tmp_path)


def test_reflect_pad_wider_than_the_axis_is_refused(tmp_path: Path) -> None:
    proto = model(
        [helper.make_node("Pad", ["x"], ["y"], mode="reflect", pads=[0, 3, 0, 0], name="wide")],
        {"x": (2, 3)},
        ["y"],
        opset=10,
    )
    refused(proto, {"x": (2, 3)}, tmp_path, r"ONNX node 'wide' \(Pad\): reflect pads \(3, 0\)")


@pytest.mark.parametrize(
    ("opset", "attrs", "split"),
    [(11, {"split": [1, 4]}, None), (13, {}, [2, 3]), (18, {"num_outputs": 2}, None), (11, {}, None)],
)
def test_split_forms(opset: int, attrs: dict[str, Any], split: list[int] | None, tmp_path: Path) -> None:
    size = 5 if (split or attrs.get("split") or attrs.get("num_outputs")) else 6
    inits = {"s": np.array(split, np.int64)} if split else {}
    ins = ["x", "s"] if split else ["x"]
    proto = model(
        [helper.make_node("Split", ins, ["a", "b"], axis=1, **attrs)],
        {"x": (2, size)},
        ["a", "b"],
        opset=opset,
        initializers=inits,
    )
    check(proto, {"x": rand(2, size)}, tmp_path)


def test_tile(tmp_path: Path) -> None:
    proto = model(
        [helper.make_node("Tile", ["x", "r"], ["y"])],
        {"x": (2, 3)},
        ["y"],
        initializers={"r": np.array([3, 2], np.int64)},
    )
    check(proto, {"x": rand(2, 3)}, tmp_path)


def test_expand_shape_from_constants_and_a_bound_input(tmp_path: Path) -> None:
    """A shape computed from Shape and a constant folds at trace time; a shape that is a graph
    input is bound with load(constants=)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Concat", ["k", "s"], ["t"], axis=0),
        helper.make_node("Expand", ["x", "t"], ["y"]),
    ]
    proto = model(nodes, {"x": (3, 1)}, ["y"], initializers={"k": np.array([2], np.int64)})
    check(proto, {"x": rand(3, 1)}, tmp_path)
    bound = model([helper.make_node("Expand", ["x", "shape"], ["y"])], {"x": (3, 1)}, ["y"])
    bound.graph.input.append(helper.make_tensor_value_info("shape", TensorProto.INT64, (3,)))
    _declare_outputs(bound, [(2, 3, 4)])
    onnx.save(bound, str(tmp_path / "b.onnx"))
    module = gonnx.load(tmp_path / "b.onnx", constants={"shape": [2, 1, 4]})
    assert module.input_names == ["x"]
    x = rand(3, 1)
    got = glcomp.compile(module, {"x": x.shape}).runtime("reference").predict(x=x)
    np.testing.assert_array_equal(got, np.broadcast_to(x, (2, 3, 4)))
    with pytest.raises(GlcompError, match=r"constants names \['nope'\]"):
        gonnx.load(tmp_path / "b.onnx", constants={"nope": [1]})
    with pytest.raises(GlcompError, match=r"constant for input 'shape' has shape \(2,\)"):
        gonnx.load(tmp_path / "b.onnx", constants={"shape": [2, 1]})


def test_gather_with_computed_indices_is_an_embedding(tmp_path: Path) -> None:
    table = rand(5, 2, 3)
    proto = model(
        [helper.make_node("Gather", ["w", "i"], ["y"])], {"i": (2, 3)}, ["y"], initializers={"w": table}
    )
    proto.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    program = check(proto, {"i": np.array([[0, 4, -1], [2, -5, 3]], np.int64)}, tmp_path)
    assert "w" in program.params


# -- normalisation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 4, 5)])
def test_instance_normalization(shape: tuple[int, ...], tmp_path: Path) -> None:
    inits = {"s": rand(3, seed=1), "b": rand(3, seed=2)}
    proto = model(
        [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)],
        {"x": shape},
        ["y"],
        initializers=inits,
    )
    program = check(proto, {"x": rand(*shape) * 2 + 1}, tmp_path)
    assert {"s", "b"} <= set(program.params)


def lrn_expected(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """The ONNX spec's LRN, as onnx/backend/test/case/node/lrn.py writes it (onnx.reference's
    LRN loops over the batch axis instead of the channels in onnx 1.23)."""
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    square_sum = np.zeros_like(x)
    for c in range(x.shape[1]):
        square_sum[:, c] = (x[:, max(0, c - lo) : min(x.shape[1], c + hi + 1)] ** 2).sum(axis=1)
    return x / (bias + alpha / size * square_sum) ** beta


@pytest.mark.parametrize("size", [5, 4, 1])
def test_lrn(size: int, tmp_path: Path, gl_runtime: Any) -> None:
    node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=0.02, beta=0.75, bias=2.0)
    proto = _declared(model([node], {"x": (2, 6, 3, 4)}, ["y"]), [(2, 6, 3, 4)])
    onnx.save(proto, str(tmp_path / "m.onnx"))
    x = rand(2, 6, 3, 4) * 3
    expected = lrn_expected(x, size, 0.02, 0.75, 2.0)
    program = glcomp.compile(gonnx.load(tmp_path / "m.onnx"), {"x": x.shape})
    np.testing.assert_allclose(program.runtime("reference").predict(x=x), expected, rtol=RTOL, atol=ATOL)
    with gl_runtime(program) as rt:
        np.testing.assert_allclose(rt.predict(x=x), expected, rtol=RTOL, atol=ATOL)


# -- convolution and pooling -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("MaxPool", {"kernel_shape": [3, 2], "pads": [0, 1, 2, 0], "strides": [2, 1]}),
        ("MaxPool", {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1], "strides": [1, 2]}),
        ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 0, 2, 2], "strides": [2, 2]}),
        ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 0, 2, 2], "count_include_pad": 1}),
        ("MaxPool", {"kernel_shape": [2, 3], "pads": [1, 2, 1, 0], "strides": [2, 4], "dilations": [2, 2]}),
        # ceil_mode: a last, partial window (counted without the ceil extension)
        ("MaxPool", {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
        ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
        (
            "AveragePool",
            {
                "kernel_shape": [3, 2],
                "strides": [3, 2],
                "pads": [1, 0, 1, 1],
                "ceil_mode": 1,
                "count_include_pad": 1,
            },
        ),
    ],
)
def test_pooling_pads_and_dilations(op: str, attrs: dict[str, Any], tmp_path: Path, gl_runtime: Any) -> None:
    proto = model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": (1, 2, 7, 9)}, ["y"], opset=12)
    check(proto, {"x": rand(1, 2, 7, 9)}, tmp_path, gl_runtime)


@pytest.mark.parametrize(
    ("op", "attrs", "w_shape"),
    [
        ("Conv", {"pads": [2, 1], "strides": [2], "dilations": [2]}, (4, 3, 3)),
        ("Conv", {"pads": [1, 1], "group": 3}, (6, 1, 3)),
        ("ConvTranspose", {"pads": [1, 0], "strides": [2], "output_padding": [1]}, (3, 2, 3)),
        ("MaxPool", {"kernel_shape": [3], "pads": [2, 1], "strides": [2]}, None),
        ("AveragePool", {"kernel_shape": [2], "pads": [1, 1]}, None),
    ],
)
def test_one_d(op: str, attrs: dict[str, Any], w_shape: tuple[int, ...] | None, tmp_path: Path) -> None:
    inits = (
        {"w": rand(*w_shape, seed=3), "b": rand(w_shape[0] if op == "Conv" else w_shape[1], seed=4)}
        if w_shape
        else {}
    )
    ins = ["x", "w", "b"] if w_shape else ["x"]
    proto = model(
        [helper.make_node(op, ins, ["y"], **attrs)], {"x": (2, 3, 8)}, ["y"], opset=12, initializers=inits
    )
    check(proto, {"x": rand(2, 3, 8)}, tmp_path)


@pytest.mark.parametrize(
    ("attrs", "match"),
    [
        (
            {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [3, 3]},
            r"dilations \[2, 2\] are supported only",
        ),
        (
            {"kernel_shape": [2, 2], "pads": [2, 0, 0, 0]},
            r"pads \[2, 0, 0, 0\] leave a pooling window without input elements",
        ),
    ],
)
def test_pooling_refusals_name_the_node(attrs: dict[str, Any], match: str, tmp_path: Path) -> None:
    proto = model(
        [helper.make_node("MaxPool", ["x"], ["y"], name="pool", **attrs)], {"x": (1, 1, 6, 6)}, ["y"]
    )
    refused(proto, {"x": (1, 1, 6, 6)}, tmp_path, r"ONNX node 'pool' \(MaxPool\): " + match)


def test_three_d_convolution_is_refused(tmp_path: Path) -> None:
    proto = model(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="c3")],
        {"x": (1, 2, 3, 4, 4)},
        ["y"],
        initializers={"w": rand(2, 2, 2, 2, 2)},
    )
    refused(proto, {"x": (1, 2, 3, 4, 4)}, tmp_path, r"ONNX node 'c3' \(Conv\): only 2-D spatial inputs")


# -- float64 ---------------------------------------------------------------------------------------
def test_float64_inputs_and_initializers_compute_in_float32(tmp_path: Path) -> None:
    """Documented tolerance: about 1e-6 relative per operation against a float64 reference."""
    w = np.random.default_rng(5).normal(size=(4, 3))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])]
    proto = model(nodes, {"x": (2, 4)}, ["y"], initializers={"w": w}, elem=TensorProto.DOUBLE)
    x = np.random.default_rng(6).normal(size=(2, 4))
    check(proto, {"x": x}, tmp_path, rtol=1e-5, atol=1e-6)
